//! Tokens of a text read in pieces from a file ([`Tokenizer::encode_reader`]): `sift perplexity`
//! scores a text of any size while holding about one read's text and ids, not the whole file
//! and all its ids (a 50 MB text is 11.8 M ids, 47 MB, outside any memory budget; issue 22).
//!
//! A byte-level BPE text is cut where [`Tokenizer::encode`]'s own pieces may be cut (after an
//! ASCII letter, before a space or a newline: every supported pre-tokenizer splits there), so the
//! ids are the whole text's. A SentencePiece text has no such place (merges may cross a space),
//! so it is read whole and tokenized once.

use super::{Engine, Tokenizer, TokenizerError, ENCODE_PIECE};
use std::io::Read;

/// Bytes read from the file at a time.
pub const READ_PIECE: usize = 256 << 10;

/// Bytes byte-level BPE pre-tokenizes at a time here (a quarter of [`ENCODE_PIECE`]): the text is
/// tokenized while the engine runs, after the budget was planned, so the pre-tokenizer's ~100
/// bytes per input byte are kept to ~1.6 MB.
const READER_ENCODE_PIECE: usize = ENCODE_PIECE / 4;

/// Why a text could not be read and tokenized.
#[derive(Debug, thiserror::Error)]
pub enum EncodeReaderError {
    #[error("reading the text failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the text is not UTF-8 (at byte {offset}): give a UTF-8 text file")]
    NotUtf8 { offset: u64 },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// The ids of a text read from `R`, yielded a piece at a time: their concatenation is
/// [`Tokenizer::encode`]'s result on the whole text (BOS first and EOS last when `add_special`
/// asks for them, as there).
pub struct EncodeReader<'t, R> {
    tok: &'t Tokenizer,
    reader: R,
    add_special: bool,
    parse_special: bool,
    read_piece: usize,
    /// Text read but not yet tokenized.
    pending: Vec<u8>,
    /// The file's offset of `pending[0]` (for the UTF-8 error).
    offset: u64,
    started: bool,
    eof: bool,
    done: bool,
}

impl Tokenizer {
    /// Tokenizes the text `reader` gives, a piece at a time (see the module's documentation).
    pub fn encode_reader<R: Read>(&self, reader: R, add_special: bool, parse_special: bool) -> EncodeReader<'_, R> {
        self.encode_reader_in_pieces(reader, add_special, parse_special, READ_PIECE)
    }

    /// [`Tokenizer::encode_reader`] reading `read_piece` bytes at a time (the same ids for any
    /// size; tests use small ones).
    #[doc(hidden)]
    pub fn encode_reader_in_pieces<R: Read>(
        &self,
        reader: R,
        add_special: bool,
        parse_special: bool,
        read_piece: usize,
    ) -> EncodeReader<'_, R> {
        EncodeReader {
            tok: self,
            reader,
            add_special,
            parse_special,
            read_piece: read_piece.max(1),
            pending: Vec::new(),
            offset: 0,
            started: false,
            eof: false,
            done: false,
        }
    }
}

/// The last place in `b` where the text may be cut: after an ASCII letter, before a space or a
/// newline (see `bpe::pieces`).
fn last_cut(b: &[u8]) -> Option<usize> {
    (1..b.len()).rev().find(|&i| b[i - 1].is_ascii_alphabetic() && (b[i] == b' ' || b[i] == b'\n'))
}

impl<R: Read> EncodeReader<'_, R> {
    /// Reads up to `read_piece` more bytes (sets `eof` at the end).
    fn read_more(&mut self) -> std::io::Result<()> {
        let start = self.pending.len();
        self.pending.resize(start + self.read_piece, 0);
        let mut got = 0;
        while got < self.read_piece {
            match self.reader.read(&mut self.pending[start + got..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.pending.truncate(start + got);
                    return Err(e);
                }
            }
        }
        self.pending.truncate(start + got);
        Ok(())
    }

    fn next_piece(&mut self) -> Result<Vec<u32>, EncodeReaderError> {
        let byte_level = matches!(self.tok.engine, Engine::Bpe(_));
        let cut = loop {
            self.read_more()?;
            if self.eof {
                break self.pending.len();
            }
            if byte_level {
                if let Some(c) = last_cut(&self.pending) {
                    break c;
                }
            }
        };
        let text = std::str::from_utf8(&self.pending[..cut])
            .map_err(|e| EncodeReaderError::NotUtf8 { offset: self.offset + e.valid_up_to() as u64 })?;
        let mut out = Vec::new();
        let tok = self.tok;
        if !self.started && self.add_special && tok.add_bos {
            out.extend(tok.bos);
        }
        self.started = true;
        tok.encode_into(text, false, self.parse_special, READER_ENCODE_PIECE, usize::MAX, &mut out)?;
        if self.eof && self.add_special && tok.add_eos {
            out.extend(tok.eos);
        }
        self.pending.drain(..cut);
        self.offset += cut as u64;
        if self.eof {
            self.done = true;
            self.pending = Vec::new();
        }
        Ok(out)
    }
}

impl<R: Read> Iterator for EncodeReader<'_, R> {
    type Item = Result<Vec<u32>, EncodeReaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.next_piece();
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::last_cut;

    #[test]
    fn cuts_only_after_a_letter_before_a_space_or_newline() {
        assert_eq!(last_cut(b"ab cd ef"), Some(5));
        assert_eq!(last_cut(b"ab\n12 "), Some(2));
        assert_eq!(last_cut(b"12 34\n\n"), None);
        assert_eq!(last_cut(b""), None);
    }
}
