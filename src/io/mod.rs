//! Files: problem inputs parsed from safetensors through a memory map ([`file`]), their
//! finiteness check ([`finite`]), memory estimates ([`memory`]), atomic output ([`atomic`]), and
//! forwards of any length computed in segments straight into an output file ([`segments`]).
//!
//! Process-wide concerns (signals, removing a temporary file when the process is killed) belong
//! to the program using these, not here.

pub mod atomic;
pub mod file;
pub mod finite;
pub mod memory;
pub mod segments;

pub use atomic::{check_output_path, write_atomic_with, AtomicFile};
pub use file::{parse, set_option, MappedFile, ProblemFile, OPTION_KEYS, TENSOR_NAMES};
pub use finite::{check_finite, first_non_finite};
pub use memory::{available_memory, check_memory, check_states, forward_bytes};
pub use segments::{
    forward_to_file, plan_segments, segment_cap, segment_tokens, Piece, SegmentHooks,
};
