//! Segmented runs: a forward over inputs of any length computed a bounded number of tokens at a
//! time, each sequence's state carried across segments, every part written straight into its
//! place in the output file.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::ops::Range;

use serde_json::Value;

use super::atomic::AtomicFile;
use super::memory::forward_bytes;
use crate::dtype::{DType, Tensor};
use crate::error::{Error, Result};
use crate::options::Options;
use crate::problem::{Inputs, Problem};

/// One sequence's part of a segment: flat tokens `lo..hi` of sequence `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The sequence.
    pub n: usize,
    /// First flat token.
    pub lo: usize,
    /// One past the last flat token.
    pub hi: usize,
}

/// Splits the tokens of `p` into segments of at most `max_tokens` tokens (rounded down to a
/// multiple of the chunk size, at least one chunk) for [`forward_to_file`]. A sequence longer
/// than the room left is cut only at multiples of the chunk size from its start, so every
/// segment's chunks are exactly chunks of the whole problem and the result is the same
/// computation, carried across segments through the state.
pub fn plan_segments(p: &Problem, max_tokens: usize) -> Vec<Vec<Piece>> {
    let bt = p.chunk_size();
    let m = (max_tokens / bt).max(1) * bt;
    let (mut segs, mut cur, mut used) = (Vec::new(), Vec::new(), 0usize);
    for (n, &(s, e)) in p.seqs().iter().enumerate() {
        if s == e {
            cur.push(Piece { n, lo: s, hi: s });
            continue;
        }
        let mut lo = s;
        while lo < e {
            let room = m - used;
            let take = if e - lo <= room {
                e - lo
            } else {
                room / bt * bt
            };
            if take == 0 {
                segs.push(std::mem::take(&mut cur));
                used = 0;
                continue;
            }
            cur.push(Piece {
                n,
                lo,
                hi: lo + take,
            });
            used += take;
            lo += take;
            if used == m {
                segs.push(std::mem::take(&mut cur));
                used = 0;
            }
        }
    }
    if !cur.is_empty() {
        segs.push(cur);
    }
    segs
}

/// The segment length [`plan_segments`] should get to cover all of `p` in as few segments as
/// `max_tokens` allows: `max_tokens`, except that a cap at or past the token count becomes the
/// token count rounded up to whole chunks, so a problem that fits is one segment.
pub fn segment_cap(p: &Problem, max_tokens: usize) -> usize {
    let whole = p
        .tokens()
        .next_multiple_of(p.chunk_size())
        .max(p.chunk_size());
    if max_tokens >= p.tokens() {
        whole
    } else {
        max_tokens
    }
}

/// Tokens per forward call that keep the forward's working memory near `budget` bytes.
pub fn segment_tokens(p: &Problem, opts: &Options, budget: u128) -> usize {
    let per_token = forward_bytes(p, opts) / (p.tokens().max(1) as u128) + 1;
    let t = (budget / per_token).min(usize::MAX as u128) as usize;
    t.max(p.chunk_size())
}

/// The flat tokens `lo..hi` of a `[B, T, ...]` tensor as a `[1, hi - lo, ...]` view (no copy).
fn token_rows<'b>(t: &'b Tensor<'_>, tokens: usize, lo: usize, hi: usize) -> Result<Tensor<'b>> {
    use crate::dtype::Data;
    use std::borrow::Cow;
    let per = t.numel() / tokens.max(1);
    let (a, b) = (lo * per, hi * per);
    let data = match t.data() {
        Data::F32(d) => Data::F32(Cow::Borrowed(&d[a..b])),
        Data::BF16(d) => Data::BF16(Cow::Borrowed(&d[a..b])),
        Data::F16(d) => Data::F16(Cow::Borrowed(&d[a..b])),
    };
    let mut shape = vec![1, hi - lo];
    shape.extend_from_slice(&t.shape()[2..]);
    Tensor::new(data, shape)
}

/// What a segmented run tells its caller as it goes, and where the caller can stop it.
pub trait SegmentHooks {
    /// Called before the segment holding flat tokens `tokens` is read; an error stops the run
    /// (and the output is not written).
    fn before(&mut self, tokens: Range<usize>) -> Result<()> {
        let _ = tokens;
        Ok(())
    }
    /// Called once the segment holding flat tokens `tokens` is written.
    fn after(&mut self, tokens: Range<usize>) {
        let _ = tokens;
    }
}

/// No hooks.
impl SegmentHooks for () {}

/// Validates `x` against `opts`, runs its forward on `device` and writes `o`, `final_state` and,
/// with `opts.output_chunk_states`, `chunk_states` into `out`, then commits it, computing at most
/// `max_tokens` tokens per call (see [`plan_segments`]) and writing each part of the output
/// straight to the file. Memory stays bounded by one segment's work whatever the input's size;
/// the input itself is only read (a memory map stays file-backed). `metadata` goes into the
/// header as given: the file's bytes are a function of the inputs, the options and `metadata`.
pub fn forward_to_file(
    device: &crate::Device,
    x: &Inputs<'_>,
    opts: &Options,
    max_tokens: usize,
    mut out: AtomicFile,
    metadata: &BTreeMap<String, String>,
    hooks: &mut dyn SegmentHooks,
) -> Result<()> {
    let path = out.path().to_path_buf();
    let path = path.as_path();
    let p = &Problem::from_inputs(x, opts).map_err(|e| Error::in_file(path, e))?;
    let out_dtype = opts.out_dtype.unwrap_or(x.q.dtype());
    let (hv, dk, dv) = (p.v_heads(), p.dk(), p.dv());
    let kv = p.state_len();
    let state_bytes = (hv * kv * 4) as u64;
    let tokens = p.tokens();
    let state_shape = p.state_shape(opts.state_v_first);
    let fs_len = p.num_seqs() as u64 * state_bytes;
    let cs_len = if opts.output_chunk_states {
        p.chunks().len() as u64 * state_bytes
    } else {
        0
    };
    let o_len = (tokens * hv * dv * out_dtype.size()) as u64;
    // f32 tensors first, so every tensor is aligned for its element type. serde_json's map
    // keeps keys sorted, so the header's bytes do not depend on any iteration order.
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let m: serde_json::Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), Value::Object(m));
    }
    let st_name = |d: DType| match d {
        DType::F32 => "F32",
        DType::BF16 => "BF16",
        DType::F16 => "F16",
    };
    header.insert(
        "final_state".into(),
        serde_json::json!({"dtype": "F32", "shape": state_shape, "data_offsets": [0, fs_len]}),
    );
    if opts.output_chunk_states {
        header.insert(
            "chunk_states".into(),
            serde_json::json!({"dtype": "F32", "shape": [p.chunks().len(), hv, dk, dv],
                "data_offsets": [fs_len, fs_len + cs_len]}),
        );
    }
    header.insert(
        "o".into(),
        serde_json::json!({"dtype": st_name(out_dtype), "shape": [p.batch(), p.seq_len(), hv, dv],
            "data_offsets": [fs_len + cs_len, fs_len + cs_len + o_len]}),
    );
    let mut hbytes = serde_json::to_vec(&Value::Object(header))
        .map_err(|e| Error::file(path, format!("cannot write: {e}")))?;
    hbytes.resize(hbytes.len().next_multiple_of(8), b' ');
    let base = 8 + hbytes.len() as u64;
    let (fs_off, cs_off, o_off) = (base, base + fs_len, base + fs_len + cs_len);

    let h0 = x.initial_state.as_ref().map(|t| t.to_f32());
    let seqs = p.seqs();
    let segments = plan_segments(p, max_tokens);
    let file = out.file()?;
    let io = |e: std::io::Error| Error::file(path, format!("cannot write: {e}"));
    let mut put = |off: u64, bytes: &[u8]| -> Result<()> {
        file.seek(SeekFrom::Start(off)).map_err(io)?;
        file.write_all(bytes).map_err(io)
    };
    put(0, &(hbytes.len() as u64).to_le_bytes())?;
    put(8, &hbytes)?;
    let state_of = |n: usize| -> Vec<f32> {
        match &h0 {
            Some(h) => h[n * hv * kv..(n + 1) * hv * kv].to_vec(),
            None => vec![0f32; hv * kv],
        }
    };
    let mut carry: Option<Vec<f32>> = None;
    for seg in &segments {
        let (lo, hi) = match (seg.first(), seg.last()) {
            (Some(a), Some(b)) => (a.lo, b.hi),
            _ => continue,
        };
        hooks.before(lo..hi)?;
        // Each piece's state entering the segment: carried from the previous segment when it
        // continues a sequence, else the sequence's initial state.
        let fresh_zero = h0.is_none() && seg.iter().all(|pc| pc.lo == seqs[pc.n].0);
        let mut init = Vec::new();
        if !fresh_zero {
            init.reserve(seg.len() * hv * kv);
            for pc in seg {
                if pc.lo > seqs[pc.n].0 {
                    match carry.take() {
                        Some(c) => init.extend_from_slice(&c),
                        None => {
                            return Err(Error::Internal(format!(
                                "segment {lo}..{hi}: no state carried into sequence {}",
                                pc.n
                            )))
                        }
                    }
                } else {
                    init.extend_from_slice(&state_of(pc.n));
                }
            }
        }
        let finals: Vec<f32> = if lo == hi {
            // Only empty sequences: their final state is their initial state.
            if fresh_zero {
                vec![0f32; seg.len() * hv * kv]
            } else {
                init
            }
        } else {
            let mut cu = vec![0i64];
            for pc in seg {
                cu.push((pc.hi - lo) as i64);
            }
            let mut shape = vec![seg.len()];
            shape.extend_from_slice(&state_shape[1..]);
            let xs = Inputs {
                q: token_rows(&x.q, tokens, lo, hi)?,
                k: token_rows(&x.k, tokens, lo, hi)?,
                v: token_rows(&x.v, tokens, lo, hi)?,
                g: token_rows(&x.g, tokens, lo, hi)?,
                beta: token_rows(&x.beta, tokens, lo, hi)?,
                initial_state: if fresh_zero {
                    None
                } else {
                    Some(Tensor::from_f32(init, shape)?)
                },
                cu_seqlens: Some(cu),
                a_log: x.a_log.clone(),
                dt_bias: x.dt_bias.clone(),
            };
            let sopts = Options {
                output_final_state: true,
                ..opts.clone()
            };
            let res = crate::forward(device, &xs, &sopts)?;
            put(
                o_off + (lo * hv * dv * out_dtype.size()) as u64,
                res.o.as_bytes(),
            )?;
            if let Some(cs) = &res.chunk_states {
                let first = p.chunks().partition_point(|c| c.start < lo) as u64;
                put(cs_off + first * state_bytes, cs.as_bytes())?;
            }
            match res.final_state {
                Some(s) => s.to_f32().into_owned(),
                None => {
                    return Err(Error::Internal(format!(
                    "segment {lo}..{hi}: the forward returned no final state though asked for one"
                )))
                }
            }
        };
        for (i, pc) in seg.iter().enumerate() {
            let s = &finals[i * hv * kv..(i + 1) * hv * kv];
            if pc.hi == seqs[pc.n].1 {
                put(fs_off + pc.n as u64 * state_bytes, bytemuck::cast_slice(s))?;
            } else {
                carry = Some(s.to_vec());
            }
        }
        hooks.after(lo..hi);
    }
    file.set_len(o_off + o_len).map_err(io)?;
    out.commit()
}
