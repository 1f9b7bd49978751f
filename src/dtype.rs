//! Element types and host tensors.

use std::borrow::Cow;

use half::{bf16, f16};

use crate::error::{checked_numel, Error, Result};

/// The element types deltanet reads and writes. Arithmetic is always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE half precision.
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// The short name used on the command line and in safetensors (`f32`, `bf16`, `f16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::BF16),
            "f16" | "float16" => Ok(DType::F16),
            _ => Err(Error::invalid("dtype", "one of f32, bf16, f16", s)),
        }
    }
}

/// A tensor's elements, borrowed or owned.
#[derive(Clone, Debug)]
pub enum Data<'a> {
    /// f32 elements.
    F32(Cow<'a, [f32]>),
    /// bf16 elements.
    BF16(Cow<'a, [bf16]>),
    /// f16 elements.
    F16(Cow<'a, [f16]>),
}

/// A dense row-major host tensor: elements and shape. Borrowing lets a memory-mapped file be read
/// without a copy.
#[derive(Clone, Debug)]
pub struct Tensor<'a> {
    data: Data<'a>,
    shape: Vec<usize>,
}

impl<'a> Tensor<'a> {
    /// A tensor over `data` with `shape`; `Err` unless the shape's product is the element count.
    pub fn new(data: Data<'a>, shape: Vec<usize>) -> Result<Self> {
        let numel = checked_numel("tensor", &shape)?;
        let len = match &data {
            Data::F32(d) => d.len(),
            Data::BF16(d) => d.len(),
            Data::F16(d) => d.len(),
        };
        if numel != len {
            return Err(Error::invalid(
                "tensor",
                format!("{numel} elements for shape {shape:?}"),
                format!("{len} elements"),
            ));
        }
        Ok(Tensor { data, shape })
    }

    /// An owned f32 tensor.
    pub fn from_f32(data: Vec<f32>, shape: Vec<usize>) -> Result<Tensor<'static>> {
        Tensor::new(Data::F32(Cow::Owned(data)), shape)
    }

    /// A borrowed f32 tensor.
    pub fn f32_view(data: &'a [f32], shape: Vec<usize>) -> Result<Self> {
        Tensor::new(Data::F32(Cow::Borrowed(data)), shape)
    }

    /// A tensor over raw little-endian bytes of `dtype`. Borrows when the bytes are aligned for
    /// the element type, copies otherwise.
    pub fn from_bytes(dtype: DType, bytes: &'a [u8], shape: Vec<usize>) -> Result<Self> {
        if bytes.len() % dtype.size() != 0 {
            return Err(Error::invalid(
                "tensor",
                format!("a multiple of {} bytes", dtype.size()),
                format!("{} bytes", bytes.len()),
            ));
        }
        fn cast<'b, T: bytemuck::Pod>(b: &'b [u8]) -> Cow<'b, [T]> {
            match bytemuck::try_cast_slice(b) {
                Ok(s) => Cow::Borrowed(s),
                Err(_) => Cow::Owned(bytemuck::allocation::pod_collect_to_vec(b)),
            }
        }
        let data = match dtype {
            DType::F32 => Data::F32(cast(bytes)),
            DType::BF16 => Data::BF16(cast(bytes)),
            DType::F16 => Data::F16(cast(bytes)),
        };
        Tensor::new(data, shape)
    }

    /// The elements.
    pub fn data(&self) -> &Data<'a> {
        &self.data
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element count.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            Data::F32(_) => DType::F32,
            Data::BF16(_) => DType::BF16,
            Data::F16(_) => DType::F16,
        }
    }

    /// The elements as f32: borrowed when already f32, converted otherwise.
    pub fn to_f32(&self) -> Cow<'_, [f32]> {
        match &self.data {
            Data::F32(d) => Cow::Borrowed(d),
            Data::BF16(d) => Cow::Owned(d.iter().map(|x| x.to_f32()).collect()),
            Data::F16(d) => Cow::Owned(d.iter().map(|x| x.to_f32()).collect()),
        }
    }

    /// The elements as little-endian bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.data {
            Data::F32(d) => bytemuck::cast_slice(d),
            Data::BF16(d) => bytemuck::cast_slice(d),
            Data::F16(d) => bytemuck::cast_slice(d),
        }
    }

    /// An owned copy (no borrow of the source left).
    pub fn into_owned(self) -> Tensor<'static> {
        let data = match self.data {
            Data::F32(d) => Data::F32(Cow::Owned(d.into_owned())),
            Data::BF16(d) => Data::BF16(Cow::Owned(d.into_owned())),
            Data::F16(d) => Data::F16(Cow::Owned(d.into_owned())),
        };
        Tensor {
            data,
            shape: self.shape,
        }
    }

    /// f32 values rounded to `dtype` (round to nearest even), as a new owned tensor.
    pub fn cast_from_f32(
        values: &[f32],
        shape: Vec<usize>,
        dtype: DType,
    ) -> Result<Tensor<'static>> {
        let data = match dtype {
            DType::F32 => Data::F32(Cow::Owned(values.to_vec())),
            DType::BF16 => Data::BF16(Cow::Owned(
                values.iter().map(|&x| bf16::from_f32(x)).collect(),
            )),
            DType::F16 => Data::F16(Cow::Owned(
                values.iter().map(|&x| f16::from_f32(x)).collect(),
            )),
        };
        Tensor::new(data, shape)
    }
}
