//! Fast tier: per-(layer, op) unit caches with switchable replacement policies.
