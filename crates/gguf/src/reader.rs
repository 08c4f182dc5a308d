//! A bounds-checked little-endian cursor over untrusted bytes.
//!
//! Every read checks the remaining length first and reports a [`GgufError::Truncated`] that
//! names what was being read. The description is built lazily, only on error.

use crate::GgufError;

/// Lazily built description of the field being read, for error messages.
pub(crate) type What<'w> = &'w dyn Fn() -> String;

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    /// Current offset from the start of the file.
    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left after the current offset.
    pub(crate) fn remaining(&self) -> u64 {
        self.bytes.len().saturating_sub(self.pos) as u64
    }

    /// Total length of the underlying bytes.
    pub(crate) fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Takes the next `n` bytes.
    pub(crate) fn take(&mut self, n: u64, what: What<'_>) -> Result<&'a [u8], GgufError> {
        let rest = self.bytes.get(self.pos..).unwrap_or_default();
        let slice = usize::try_from(n).ok().and_then(|n| rest.get(..n)).ok_or_else(|| GgufError::Truncated {
            what: what(),
            needed: n,
            offset: self.pos(),
            file_size: self.len(),
        })?;
        self.pos += slice.len();
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: What<'_>) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: What<'_>) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: What<'_>) -> Result<u16, GgufError> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self, what: What<'_>) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: What<'_>) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a GGUF string: a `u64` byte length followed by that many UTF-8 bytes.
    pub(crate) fn string(&mut self, what: What<'_>) -> Result<String, GgufError> {
        self.str(what).map(str::to_owned)
    }

    /// [`Reader::string`] borrowed from the bytes.
    pub(crate) fn str(&mut self, what: What<'_>) -> Result<&'a str, GgufError> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let start = self.pos();
        let bytes = self.take(len, &|| format!("{} ({len} bytes)", what()))?;
        std::str::from_utf8(bytes)
            .map_err(|e| GgufError::InvalidUtf8 { what: what(), offset: start + e.valid_up_to() as u64 })
    }
}
