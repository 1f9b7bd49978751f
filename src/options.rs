//! The forward's options: FLA's keyword arguments, plus the head map and state layout choices.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Which q/k head a value head reads when there are more value heads than q/k heads (GVA).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HeadMap {
    /// `h(j) = j / (HV / H)`: consecutive value heads share a q/k head (FLA's layout).
    #[default]
    Grouped,
    /// `h(j) = j % H`: value heads cycle over the q/k heads (llama.cpp's Qwen3.5 layout).
    Tiled,
}

impl std::str::FromStr for HeadMap {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "grouped" => Ok(HeadMap::Grouped),
            "tiled" => Ok(HeadMap::Tiled),
            _ => Err(Error::invalid(
                "head_map",
                "\"grouped\" or \"tiled\"",
                format!("{s:?}"),
            )),
        }
    }
}

/// How exactly the GPU prefill computes its products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Every product to f32 rounding (relative error about 1e-6 against float64): f32 operands
    /// split into bf16 pieces on the tensor cores, or f32 arithmetic.
    #[default]
    Exact,
    /// bf16 operands with f32 accumulation where the fused GPU kernel for bf16 inputs runs
    /// (relative error about 1e-3, as FLA's kernels); elsewhere the same as `Exact`.
    Fast,
}

impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "exact" => Ok(Precision::Exact),
            "fast" => Ok(Precision::Fast),
            _ => Err(Error::invalid(
                "precision",
                "\"exact\" or \"fast\"",
                format!("{s:?}"),
            )),
        }
    }
}

/// Options of the forward and the recurrent step. `Options::default()` is FLA's default call,
/// except that the final state is returned (`output_final_state: true`).
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Multiplies q; `None` means `1/sqrt(K)`.
    pub scale: Option<f32>,
    /// Replace q and k by `x / sqrt(sum x^2 + 1e-6)` over K before anything else.
    pub use_qk_l2norm: bool,
    /// beta holds logits: use `sigmoid(beta)` (or `2 sigmoid(beta)` with `allow_neg_eigval`).
    pub beta_is_logits: bool,
    /// With `beta_is_logits`, beta ranges over (0, 2), letting the transition have negative
    /// eigenvalues.
    pub allow_neg_eigval: bool,
    /// g holds the raw gate input: use `-exp(A_log[j]) * softplus(g + dt_bias[j])`.
    pub gate_in_kernel: bool,
    /// States are stored `[N, HV, V, K]` instead of `[N, HV, K, V]` (llama.cpp's and
    /// FlashInfer's layout). The CPU decode step then works on the rows where they lie, in an
    /// order of its own: the two layouts agree to rounding, not to the bit.
    pub state_v_first: bool,
    /// Tokens per chunk of the chunked forward: 16, 32 or 64; the chunk states
    /// (`output_chunk_states`) come at this granularity. Without chunk states a backend may
    /// compute in smaller chunks where that is faster (the CPU without AVX-512 takes 32): the
    /// same arithmetic up to rounding.
    pub chunk_size: usize,
    /// How value heads map to q/k heads.
    pub head_map: HeadMap,
    /// Return the state after each sequence's last token.
    pub output_final_state: bool,
    /// Return the state entering every chunk (`h`, `[chunks, HV, K, V]` f32, always K-major).
    pub output_chunk_states: bool,
    /// The output's element type; `None` means the input's (FLA's convention).
    pub out_dtype: Option<DType>,
    /// Exact (the default) or fast products; see [`Precision`].
    pub precision: Precision,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            scale: None,
            use_qk_l2norm: false,
            beta_is_logits: false,
            allow_neg_eigval: false,
            gate_in_kernel: false,
            state_v_first: false,
            chunk_size: 64,
            head_map: HeadMap::Grouped,
            output_final_state: true,
            output_chunk_states: false,
            out_dtype: None,
            precision: Precision::Exact,
        }
    }
}

/// The chunk sizes the chunked forward supports.
pub const CHUNK_SIZES: [usize; 3] = [16, 32, 64];

impl Options {
    /// The scale actually applied to q for head dimension `k`.
    pub fn scale_for(&self, k: usize) -> f32 {
        self.scale.unwrap_or(1.0 / (k as f32).sqrt())
    }

    /// Checks the options that make sense on their own.
    pub fn validate(&self) -> Result<()> {
        if !CHUNK_SIZES.contains(&self.chunk_size) {
            return Err(Error::invalid(
                "chunk_size",
                "16, 32 or 64",
                self.chunk_size,
            ));
        }
        if self.allow_neg_eigval && !self.beta_is_logits {
            return Err(Error::invalid(
                "allow_neg_eigval",
                "beta_is_logits = true (it doubles sigmoid(beta))",
                "beta_is_logits = false",
            ));
        }
        if let Some(s) = self.scale {
            if !s.is_finite() {
                return Err(Error::invalid("scale", "a finite number", s));
            }
        }
        Ok(())
    }
}
