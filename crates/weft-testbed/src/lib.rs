//! weft-testbed
