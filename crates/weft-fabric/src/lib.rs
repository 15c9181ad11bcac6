//! weft-fabric
