//! The one error type of the crate. Every message names the argument at fault and says what was
//! expected and what was given.

/// Everything that can go wrong in deltanet, as a value: no public function panics on bad input.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument has the wrong shape, rank, value or relation to another argument.
    #[error("{arg}: expected {expected}, got {got}")]
    Invalid {
        /// The argument's name, as in FLA (`q`, `cu_seqlens`, `chunk_size`, ...).
        arg: &'static str,
        /// What would have been accepted.
        expected: String,
        /// What was given.
        got: String,
    },
    /// An argument's element count or byte size does not fit in 64 bits (or in memory).
    #[error("{arg}: size overflows: {detail}")]
    Overflow {
        /// The argument whose size overflowed.
        arg: &'static str,
        /// The dimensions that overflowed.
        detail: String,
    },
    /// The CUDA backend cannot be used on this machine (no driver, no NVRTC, no GPU).
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// A CUDA driver call or kernel launch failed.
    #[error("CUDA error in {context}: {message}")]
    Cuda {
        /// What was being done.
        context: String,
        /// The driver's message.
        message: String,
    },
    /// A file could not be read, parsed or written, or its contents do not describe a valid
    /// problem. The message names the tensor or option at fault, with expected vs got.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// An internal invariant failed: a bug in deltanet, not a fault of the input.
    #[error("internal error: {0}")]
    Internal(String),
    /// NVRTC rejected a kernel source.
    #[error("NVRTC failed to compile kernel {kernel} for {arch}: {log}")]
    Compile {
        /// The kernel source's name.
        kernel: String,
        /// The target architecture (`sm_90`).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(arg: &'static str, expected: impl ToString, got: impl ToString) -> Self {
        Error::Invalid {
            arg,
            expected: expected.to_string(),
            got: got.to_string(),
        }
    }

    /// Attributes an error to the file at `path` (a [`Error::File`] is returned unchanged).
    pub fn in_file(path: &std::path::Path, err: Error) -> Self {
        match err {
            Error::File { .. } => err,
            other => Error::File {
                path: path.display().to_string(),
                message: other.to_string(),
            },
        }
    }

    /// Shorthand for [`Error::File`].
    pub fn file(path: &std::path::Path, message: impl ToString) -> Self {
        Error::File {
            path: path.display().to_string(),
            message: message.to_string(),
        }
    }
}

/// Fails with [`Error::Invalid`] unless a buffer holds exactly `expected` elements.
pub(crate) fn check_len(arg: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::invalid(
            arg,
            format!("{expected} elements"),
            format!("{got} elements"),
        ))
    }
}

/// The product of `dims`, or [`Error::Overflow`] naming `arg`.
pub(crate) fn checked_numel(arg: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        // Keep every element count addressable in bytes of f64, so later `* 8` cannot overflow.
        .filter(|&n| n <= (isize::MAX as usize) / 8)
        .ok_or_else(|| Error::Overflow {
            arg,
            detail: format!("{dims:?}"),
        })
}
