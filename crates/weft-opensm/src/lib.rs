//! weft-opensm
