//! Running an external program with a deadline: weft's one bounded runner, [`weft_proc`].
pub use weft_proc::{Invocation, ProcessError, run_bounded, run_bounded_bytes};
