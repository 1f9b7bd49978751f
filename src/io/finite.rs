//! The finiteness check of input tensors: one pass over the bits, whatever the element type.

use std::ops::Range;
use std::path::Path;

use crate::dtype::{Data, Tensor};
use crate::error::{Error, Result};

/// The first element of `t` in the flat index range `elems` that is NaN or infinite (with
/// `allow_neg_inf`, minus infinity is let through: a gate `g = -inf` is a hard reset), with its
/// value as f32. Reads only the bits (an all-ones exponent means NaN or infinity), so it costs
/// one pass over the bytes.
pub fn first_non_finite(
    t: &Tensor<'_>,
    elems: Range<usize>,
    allow_neg_inf: bool,
) -> Option<(usize, f32)> {
    let lo = elems.start;
    // Per type: the exponent mask and minus infinity's bits (never matched when not allowed).
    macro_rules! scan {
        ($d:expr, $mask:expr, $neg_inf:expr) => {{
            let neg_inf = if allow_neg_inf { $neg_inf } else { 0 };
            $d.get(elems)?
                .iter()
                .position(|x| x.to_bits() & $mask == $mask && x.to_bits() != neg_inf)
                .map(|i| (i, f32::from($d[lo + i])))
        }};
    }
    let found = match t.data() {
        Data::F32(d) => scan!(d, 0x7f80_0000u32, 0xff80_0000u32),
        Data::BF16(d) => scan!(d, 0x7f80u16, 0xff80u16),
        Data::F16(d) => scan!(d, 0x7c00u16, 0xfc00u16),
    };
    found.map(|(i, x)| (lo + i, x))
}

/// Fails, naming the file, the tensor and the first bad element, when tensor `name` of the file
/// at `path` holds a NaN or an infinity among its flat elements `elems`. `axes` names the
/// dimensions for the message (`"b, t, h, d"`); `allow_neg_inf` as in [`first_non_finite`].
pub fn check_finite(
    path: &Path,
    name: &str,
    axes: &str,
    t: &Tensor<'_>,
    elems: Range<usize>,
    allow_neg_inf: bool,
) -> Result<()> {
    let Some((i, x)) = first_non_finite(t, elems, allow_neg_inf) else {
        return Ok(());
    };
    let mut coord = vec![0usize; t.shape().len()];
    let mut rest = i;
    for (c, &d) in coord.iter_mut().zip(t.shape()).rev() {
        *c = rest % d.max(1);
        rest /= d.max(1);
    }
    Err(Error::file(
        path,
        format!(
            "tensor {name}: expected finite values, got {x} at flat index {i}, [{axes}] = {coord:?} of shape {:?}",
            t.shape()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn finds_the_first_nan_or_infinity_in_every_dtype() {
        let mut v = vec![0.5f32; 24];
        v[13] = f32::NEG_INFINITY;
        v[17] = f32::NAN;
        let shape = vec![1, 3, 2, 4];
        let f = Tensor::from_f32(v.clone(), shape.clone()).expect("f32");
        let b: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
        let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        let b = Tensor::new(Data::BF16(b.into()), shape.clone()).expect("bf16");
        let h = Tensor::new(Data::F16(h.into()), shape).expect("f16");
        for t in [&f, &b, &h] {
            assert_eq!(
                first_non_finite(t, 0..24, false),
                Some((13, f32::NEG_INFINITY))
            );
            let (i, x) = first_non_finite(t, 14..24, false).expect("the NaN");
            assert_eq!(i, 17);
            assert!(x.is_nan());
            // Minus infinity let through: the NaN is the first bad value.
            assert_eq!(first_non_finite(t, 0..24, true).map(|f| f.0), Some(17));
            assert_eq!(first_non_finite(t, 0..13, false), None);
            assert_eq!(first_non_finite(t, 18..24, false), None);
        }
        // Plus infinity is refused even where minus infinity is allowed.
        let pinf = Tensor::from_f32(vec![0.0, f32::INFINITY], vec![2]).expect("f32");
        assert_eq!(
            first_non_finite(&pinf, 0..2, true),
            Some((1, f32::INFINITY))
        );
        // The largest finite values are not flagged.
        let big = Tensor::from_f32(vec![f32::MAX, f32::MIN, 0.0], vec![3]).expect("f32");
        assert_eq!(first_non_finite(&big, 0..3, false), None);
        let big = Tensor::new(Data::F16(vec![f16::MAX, f16::MIN].into()), vec![2]).expect("f16");
        assert_eq!(first_non_finite(&big, 0..2, false), None);
        let big =
            Tensor::new(Data::BF16(vec![bf16::MAX, bf16::MIN].into()), vec![2]).expect("bf16");
        assert_eq!(first_non_finite(&big, 0..2, false), None);
    }

    #[test]
    fn the_message_names_tensor_index_and_coordinates() {
        let mut v = vec![0.0f32; 24];
        v[17] = f32::INFINITY;
        let t = Tensor::from_f32(v, vec![1, 3, 2, 4]).expect("f32");
        let e = check_finite(Path::new("in.st"), "k", "b, t, h, d", &t, 0..24, false)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("in.st: tensor k"), "{e}");
        assert!(e.contains("inf at flat index 17"), "{e}");
        // 17 = ((0 * 3 + 2) * 2 + 0) * 4 + 1.
        assert!(e.contains("[b, t, h, d] = [0, 2, 0, 1]"), "{e}");
    }
}
