//! Tensors as headers describe them, and the pure parsers of those headers
//! (safetensors JSON headers and GGUF headers). Bytes in, tensors out; no I/O here.

use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::PlanError;

/// The largest safetensors header weft accepts. The format's own reference implementation
/// refuses headers over 100 MB (safetensors `MAX_HEADER_SIZE`); so does weft, before any
/// allocation of that size.
pub const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// An element type, as safetensors names it (GGUF types map onto `Ggml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    F8E4M3,
    F8E5M2,
    F8E8M0,
    F4,
    I16,
    U16,
    F16,
    Bf16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
    /// A GGML block type: `block` elements stored in `block_bytes` bytes.
    Ggml {
        name: &'static str,
        block: u32,
        block_bytes: u32,
    },
    /// A name this version does not know; sizes come from the data offsets.
    Other(String),
}

impl Dtype {
    /// Parses a safetensors dtype name.
    pub fn from_safetensors(s: &str) -> Dtype {
        match s {
            "BOOL" => Dtype::Bool,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E5M2" => Dtype::F8E5M2,
            "F8_E8M0" => Dtype::F8E8M0,
            "F4" => Dtype::F4,
            "I16" => Dtype::I16,
            "U16" => Dtype::U16,
            "F16" => Dtype::F16,
            "BF16" => Dtype::Bf16,
            "I32" => Dtype::I32,
            "U32" => Dtype::U32,
            "F32" => Dtype::F32,
            "F64" => Dtype::F64,
            "I64" => Dtype::I64,
            "U64" => Dtype::U64,
            other => Dtype::Other(other.to_string()),
        }
    }

    /// The safetensors name of this dtype.
    pub fn name(&self) -> &str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::F4 => "F4",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::Ggml { name, .. } => name,
            Dtype::Other(s) => s,
        }
    }

    /// Bytes that `n` elements take, when the dtype is known.
    pub fn bytes_for(&self, n: u64) -> Option<u64> {
        let bits: u64 = match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::F8E8M0 => {
                8
            }
            Dtype::F4 => 4,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::Bf16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 64,
            Dtype::Ggml {
                block, block_bytes, ..
            } => {
                let blocks = n.div_ceil(u64::from(*block));
                return blocks.checked_mul(u64::from(*block_bytes));
            }
            Dtype::Other(_) => return None,
        };
        n.checked_mul(bits).map(|b| b.div_ceil(8))
    }

    /// Whether this is a floating-point type of 16 bits or more (weights stored unquantised).
    pub fn is_wide_float(&self) -> bool {
        matches!(self, Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor of a checkpoint: its name, element type, shape and size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub bytes: u64,
}

impl Tensor {
    /// Builds a tensor whose size follows from its dtype and shape.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: Vec<u64>) -> Tensor {
        let numel = shape.iter().product::<u64>();
        let bytes = dtype.bytes_for(numel).unwrap_or(0);
        Tensor {
            name: name.into(),
            dtype,
            shape,
            bytes,
        }
    }

    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A string from the header, borrowed when it holds no escapes (every real tensor name and
/// dtype), so parsing allocates only what the tensor keeps.
pub(crate) struct Str<'de>(pub(crate) std::borrow::Cow<'de, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(std::borrow::Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'de>, E> {
                Ok(Str(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor<'a> {
    #[serde(borrow)]
    dtype: Str<'a>,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

struct RawHeader<'a>(Vec<(Str<'a>, RawTensor<'a>)>);

impl<'de> Deserialize<'de> for RawHeader<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawHeader<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a safetensors header: an object of tensors")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader<'de>, A::Error> {
                // A header of n tensors is at least ~60 n bytes; size_hint is unknown for
                // JSON, so the vector grows as it must.
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    if key.0 == "__metadata__" {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        let t: RawTensor<'de> = map.next_value().map_err(|e: A::Error| {
                            de::Error::custom(format!("tensor {:?}: {e}", key.0))
                        })?;
                        out.push((key, t));
                    }
                }
                Ok(RawHeader(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Reads the 8-byte little-endian header length at the start of a safetensors file and
/// checks it against the limit and, when known, the file's size. `what` names the file in
/// errors.
pub fn safetensors_header_len(
    prefix: &[u8],
    file_size: Option<u64>,
    what: &str,
) -> Result<u64, PlanError> {
    let bytes: [u8; 8] = prefix
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| PlanError::Header {
            what: what.to_string(),
            why: format!(
                "{} bytes: too short for the 8-byte header length",
                prefix.len()
            ),
        })?;
    let n = u64::from_le_bytes(bytes);
    if n > MAX_SAFETENSORS_HEADER {
        return Err(PlanError::Header {
            what: what.to_string(),
            why: format!(
                "header claims {n} bytes, over the {MAX_SAFETENSORS_HEADER}-byte limit of the safetensors format"
            ),
        });
    }
    if let Some(size) = file_size
        && n > size.saturating_sub(8)
    {
        return Err(PlanError::Header {
            what: what.to_string(),
            why: format!("header claims {n} bytes but the file holds only {size} bytes"),
        });
    }
    Ok(n)
}

/// Parses the JSON header of a safetensors file (the bytes after the 8-byte length).
/// Every tensor's offsets must agree with its dtype and shape.
pub fn parse_safetensors_header(json: &[u8], what: &str) -> Result<Vec<Tensor>, PlanError> {
    let raw: RawHeader = serde_json::from_slice(json).map_err(|e| PlanError::Header {
        what: what.to_string(),
        why: format!("not a safetensors JSON header: {e}"),
    })?;
    let mut out = Vec::with_capacity(raw.0.len());
    for (name, t) in raw.0 {
        let name = name.0;
        let [begin, end] = t.data_offsets;
        if end < begin {
            return Err(PlanError::Header {
                what: what.to_string(),
                why: format!("tensor {name}: data_offsets [{begin}, {end}] run backwards"),
            });
        }
        let dtype = Dtype::from_safetensors(&t.dtype.0);
        let numel = t
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| PlanError::Header {
                what: what.to_string(),
                why: format!("tensor {name}: shape {:?} overflows", t.shape),
            })?;
        let bytes = end - begin;
        if let Some(expect) = dtype.bytes_for(numel)
            && expect != bytes
        {
            return Err(PlanError::Header {
                what: what.to_string(),
                why: format!(
                    "tensor {name}: {} {:?} takes {expect} bytes but its data_offsets span {bytes}",
                    dtype, t.shape
                ),
            });
        }
        out.push(Tensor {
            name: name.into_owned(),
            dtype,
            shape: t.shape,
            bytes,
        });
    }
    Ok(out)
}

/// Metadata values of a GGUF file that the planner reads.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    /// Arrays are kept only as their length and, for integer arrays, their values
    /// (per-layer head counts); string arrays (vocabularies) are skipped.
    Array(Vec<i128>, u64),
}

/// A parsed GGUF header: its metadata and tensors.
#[derive(Debug, Clone, Default)]
pub struct GgufHeader {
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<Tensor>,
}

impl GgufHeader {
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        match self.get(key)? {
            GgufValue::Int(i) => u64::try_from(*i).ok(),
            GgufValue::Array(v, _) => v.iter().copied().max().and_then(|i| u64::try_from(i).ok()),
            _ => None,
        }
    }
    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// The outcome of parsing a GGUF prefix: done, or the prefix was too short.
#[derive(Debug)]
pub enum GgufParse {
    Done(GgufHeader),
    /// The header continues past the bytes given; read at least this many and try again.
    NeedMore(u64),
}

/// GGML tensor types: (id, name, elements per block, bytes per block), from ggml.h / ggml.c
/// (`ggml_type` and `type_traits`).
const GGML_TYPES: &[(u32, &str, u32, u32)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

/// The GGML type with this id.
pub fn ggml_type(id: u32) -> Option<Dtype> {
    GGML_TYPES
        .iter()
        .find(|t| t.0 == id)
        .map(|&(_, name, block, block_bytes)| Dtype::Ggml {
            name,
            block,
            block_bytes,
        })
}

/// The id of the GGML type with this name (for writing test files).
pub fn ggml_type_id(name: &str) -> Option<u32> {
    GGML_TYPES.iter().find(|t| t.1 == name).map(|t| t.0)
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

enum Short {
    More,
    Bad(String),
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], Short> {
        let n = usize::try_from(n).map_err(|_| Short::Bad("length overflows".into()))?;
        let end = self.at.checked_add(n).ok_or(Short::More)?;
        let s = self.b.get(self.at..end).ok_or(Short::More)?;
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, Short> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, Short> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn string(&mut self) -> Result<String, Short> {
        let n = self.u64()?;
        if n > 1 << 30 {
            return Err(Short::Bad(format!("a string claims {n} bytes")));
        }
        let s = self.take(n)?;
        Ok(String::from_utf8_lossy(s).into_owned())
    }
    fn scalar(&mut self, ty: u32) -> Result<GgufValue, Short> {
        Ok(match ty {
            0 => GgufValue::Int(i128::from(self.take(1)?[0])),
            1 => GgufValue::Int(i128::from(self.take(1)?[0] as i8)),
            2 => {
                let s = self.take(2)?;
                GgufValue::Int(i128::from(u16::from_le_bytes([s[0], s[1]])))
            }
            3 => {
                let s = self.take(2)?;
                GgufValue::Int(i128::from(i16::from_le_bytes([s[0], s[1]])))
            }
            4 => GgufValue::Int(i128::from(self.u32()?)),
            5 => GgufValue::Int(i128::from(self.u32()? as i32)),
            6 => GgufValue::Float(f64::from(f32::from_bits(self.u32()?))),
            7 => GgufValue::Bool(self.take(1)?[0] != 0),
            8 => GgufValue::Str(self.string()?),
            10 => GgufValue::Int(i128::from(self.u64()?)),
            11 => GgufValue::Int(i128::from(self.u64()? as i64)),
            12 => GgufValue::Float(f64::from_bits(self.u64()?)),
            other => return Err(Short::Bad(format!("unknown metadata value type {other}"))),
        })
    }
}

/// Parses the header of a GGUF file (versions 2 and 3) from a prefix of the file.
pub fn parse_gguf(prefix: &[u8], what: &str) -> Result<GgufParse, PlanError> {
    let bad = |why: String| PlanError::Header {
        what: what.to_string(),
        why,
    };
    let mut c = Cursor { b: prefix, at: 0 };
    let res = (|| -> Result<GgufHeader, Short> {
        if c.take(4)? != b"GGUF" {
            return Err(Short::Bad("no GGUF magic at the start".into()));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(Short::Bad(format!(
                "GGUF version {version}; weft reads versions 2 and 3"
            )));
        }
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        if n_tensors > 10_000_000 || n_kv > 10_000_000 {
            return Err(Short::Bad(format!(
                "header claims {n_tensors} tensors and {n_kv} metadata keys"
            )));
        }
        let mut h = GgufHeader::default();
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            let value = if ty == 9 {
                let ety = c.u32()?;
                let n = c.u64()?;
                let mut ints = Vec::new();
                for _ in 0..n {
                    match c.scalar(ety)? {
                        GgufValue::Int(i) if n <= 4096 => ints.push(i),
                        _ => {}
                    }
                }
                GgufValue::Array(ints, n)
            } else {
                c.scalar(ty)?
            };
            h.metadata.push((key, value));
        }
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()?;
            if n_dims > 8 {
                return Err(Short::Bad(format!("tensor {name}: {n_dims} dimensions")));
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                shape.push(c.u64()?);
            }
            let ty = c.u32()?;
            let _offset = c.u64()?;
            let dtype = ggml_type(ty).ok_or_else(|| {
                Short::Bad(format!(
                    "tensor {name}: GGML type {ty} is not one weft knows"
                ))
            })?;
            // GGUF lists dimensions innermost first; keep them outermost first like safetensors.
            shape.reverse();
            h.tensors.push(Tensor::new(name, dtype, shape));
        }
        Ok(h)
    })();
    match res {
        Ok(h) => Ok(GgufParse::Done(h)),
        Err(Short::More) => Ok(GgufParse::NeedMore(
            (prefix.len() as u64).saturating_mul(2).max(1 << 20),
        )),
        Err(Short::Bad(why)) => Err(bad(why)),
    }
}
