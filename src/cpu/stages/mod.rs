//! The stage-by-stage CPU path, one file per stage (the same names as `cuda/stages/`): each stage
//! over whole `[B, T, ...]` buffers, parallel over chunks or (sequence, head). It is the tested
//! reference path; each file's block function (one chunk of one head) is also what
//! [`super::fused`] composes, but for `wy` and chunk_state's `v_new`, which it replaces by one
//! product (`v_new = A_inv (beta (v - e^gamma K h))`).

pub(crate) mod chunk_output;
pub(crate) mod chunk_state;
pub(crate) mod cumsum;
pub(crate) mod gate;
pub(crate) mod kkt;
pub(crate) mod l2norm;
pub(crate) mod recurrent;
pub(crate) mod solve_tril;
pub(crate) mod wy;
