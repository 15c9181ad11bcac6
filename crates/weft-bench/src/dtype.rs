//! Element types and reduction operations, with the reduction kernels, the test data every rank
//! writes and the expected results computed in higher precision (f64 for floats, wrapping
//! 128-bit integers for integers).

use std::str::FromStr;

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// The string forms of an enum named by its `name()` (nccl-tests' names): `Display`, and
/// `String` both ways for serde (`into`/`try_from`), parsing through its `FromStr`.
macro_rules! by_name {
    ($t:ty) => {
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.name().to_string()
            }
        }

        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(s: String) -> Result<$t, String> {
                s.parse()
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.name())
            }
        }
    };
}
pub(crate) use by_name;

/// An element type, named as nccl-tests names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum DataType {
    U8,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

impl DataType {
    /// Every type, in nccl-tests' order.
    pub const ALL: [DataType; 7] = [
        DataType::U8,
        DataType::I32,
        DataType::I64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::BF16,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::U8 => 1,
            DataType::F16 | DataType::BF16 => 2,
            DataType::I32 | DataType::F32 => 4,
            DataType::I64 | DataType::F64 => 8,
        }
    }

    /// nccl-tests' name (`float`, `half`, `bfloat16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::I64 => "int64",
            DataType::F16 => "half",
            DataType::BF16 => "bfloat16",
            DataType::F32 => "float",
            DataType::F64 => "double",
        }
    }

    fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::BF16 | DataType::F32 | DataType::F64
        )
    }

    /// Unit roundoff of a float type (0 for integers).
    fn eps(self) -> f64 {
        match self {
            DataType::F16 => 2f64.powi(-11),
            DataType::BF16 => 2f64.powi(-8),
            DataType::F32 => 2f64.powi(-24),
            DataType::F64 => 2f64.powi(-53),
            _ => 0.0,
        }
    }
}

by_name!(DataType);

impl FromStr for DataType {
    type Err = String;
    fn from_str(s: &str) -> Result<DataType, String> {
        Ok(match s {
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "int64" | "i64" => DataType::I64,
            "half" | "f16" | "float16" => DataType::F16,
            "bfloat16" | "bf16" => DataType::BF16,
            "float" | "f32" | "float32" => DataType::F32,
            "double" | "f64" | "float64" => DataType::F64,
            _ => {
                return Err(format!(
                    "unknown type {s:?} (uint8 int32 int64 half bfloat16 float double, or all)"
                ));
            }
        })
    }
}

/// A reduction operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum RedOp {
    Sum,
    Prod,
    Min,
    Max,
}

impl RedOp {
    /// Every operation, in nccl-tests' order.
    pub const ALL: [RedOp; 4] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min];

    /// nccl-tests' name.
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Min => "min",
            RedOp::Max => "max",
        }
    }
}

by_name!(RedOp);

impl FromStr for RedOp {
    type Err = String;
    fn from_str(s: &str) -> Result<RedOp, String> {
        Ok(match s {
            "sum" => RedOp::Sum,
            "prod" => RedOp::Prod,
            "min" => RedOp::Min,
            "max" => RedOp::Max,
            _ => return Err(format!("unknown op {s:?} (sum prod min max, or all)")),
        })
    }
}

// `int_kernel` and `float_kernel` run the same loop with other arithmetic: integers wrap on
// sum and product, floats follow IEEE; one macro would need every op passed in.
macro_rules! int_kernel {
    ($t:ty, $op:expr, $dst:expr, $src:expr) => {{
        const W: usize = std::mem::size_of::<$t>();
        for (d, s) in $dst.chunks_exact_mut(W).zip($src.chunks_exact(W)) {
            let a = <$t>::from_ne_bytes(d.try_into().unwrap_or([0; W]));
            let b = <$t>::from_ne_bytes(s.try_into().unwrap_or([0; W]));
            let r: $t = match $op {
                RedOp::Sum => a.wrapping_add(b),
                RedOp::Prod => a.wrapping_mul(b),
                RedOp::Min => a.min(b),
                RedOp::Max => a.max(b),
            };
            d.copy_from_slice(&r.to_ne_bytes());
        }
    }};
}

macro_rules! float_kernel {
    ($t:ty, $op:expr, $dst:expr, $src:expr) => {{
        const W: usize = std::mem::size_of::<$t>();
        for (d, s) in $dst.chunks_exact_mut(W).zip($src.chunks_exact(W)) {
            let a = <$t>::from_ne_bytes(d.try_into().unwrap_or([0; W]));
            let b = <$t>::from_ne_bytes(s.try_into().unwrap_or([0; W]));
            let r: $t = match $op {
                RedOp::Sum => a + b,
                RedOp::Prod => a * b,
                RedOp::Min => a.min(b),
                RedOp::Max => a.max(b),
            };
            d.copy_from_slice(&r.to_ne_bytes());
        }
    }};
}

macro_rules! half_kernel {
    ($t:ty, $op:expr, $dst:expr, $src:expr) => {{
        for (d, s) in $dst.chunks_exact_mut(2).zip($src.chunks_exact(2)) {
            let a = <$t>::from_ne_bytes([d[0], d[1]]).to_f32();
            let b = <$t>::from_ne_bytes([s[0], s[1]]).to_f32();
            let r = match $op {
                RedOp::Sum => a + b,
                RedOp::Prod => a * b,
                RedOp::Min => a.min(b),
                RedOp::Max => a.max(b),
            };
            d.copy_from_slice(&<$t>::from_f32(r).to_ne_bytes());
        }
    }};
}

/// `dst[i] = dst[i] op src[i]` over whole elements of `dt` (16-bit floats are combined in f32
/// and rounded once per step, as NCCL does).
pub fn reduce(dt: DataType, op: RedOp, dst: &mut [u8], src: &[u8]) {
    match dt {
        DataType::U8 => int_kernel!(u8, op, dst, src),
        DataType::I32 => int_kernel!(i32, op, dst, src),
        DataType::I64 => int_kernel!(i64, op, dst, src),
        DataType::F32 => float_kernel!(f32, op, dst, src),
        DataType::F64 => float_kernel!(f64, op, dst, src),
        DataType::F16 => half_kernel!(f16, op, dst, src),
        DataType::BF16 => half_kernel!(bf16, op, dst, src),
    }
}

/// The value rank `rank` puts at element `i` (as f64 for floats, i128 for integers, both in
/// one `Value`). Floats are small integers (sum, min, max) or ±2^k (prod), exact in every type
/// and such that a sum or product over up to 64 ranks stays exact even in bfloat16.
fn input(dt: DataType, op: Option<RedOp>, rank: usize, i: usize) -> Value {
    let h = (rank as u64).wrapping_mul(0x9E37_79B9) ^ (i as u64).wrapping_mul(0x85EB_CA6B);
    let h = h ^ (h >> 13);
    if dt.is_float() {
        if op == Some(RedOp::Prod) {
            const P: [f64; 5] = [1.0, 2.0, 0.5, -1.0, -2.0];
            Value::F(P[(h % 5) as usize])
        } else {
            Value::F((h % 7) as f64 - 3.0)
        }
    } else if dt == DataType::U8 {
        Value::I(i128::from((h % 256) as u8))
    } else {
        Value::I((h % 19) as i128 - 9)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    F(f64),
    I(i128),
}

fn encode(dt: DataType, v: Value, out: &mut [u8]) {
    match (dt, v) {
        (DataType::U8, Value::I(x)) => out[0] = x as u8,
        (DataType::I32, Value::I(x)) => out.copy_from_slice(&(x as i32).to_ne_bytes()),
        (DataType::I64, Value::I(x)) => out.copy_from_slice(&(x as i64).to_ne_bytes()),
        (DataType::F16, Value::F(x)) => out.copy_from_slice(&f16::from_f64(x).to_ne_bytes()),
        (DataType::BF16, Value::F(x)) => out.copy_from_slice(&bf16::from_f64(x).to_ne_bytes()),
        (DataType::F32, Value::F(x)) => out.copy_from_slice(&(x as f32).to_ne_bytes()),
        (DataType::F64, Value::F(x)) => out.copy_from_slice(&x.to_ne_bytes()),
        _ => unreachable!("value kind follows the type"),
    }
}

fn decode(dt: DataType, b: &[u8]) -> Value {
    match dt {
        DataType::U8 => Value::I(i128::from(b[0])),
        DataType::I32 => Value::I(i128::from(i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))),
        DataType::I64 => Value::I(i128::from(i64::from_ne_bytes(
            b[..8].try_into().unwrap_or([0; 8]),
        ))),
        DataType::F16 => Value::F(f16::from_ne_bytes([b[0], b[1]]).to_f64()),
        DataType::BF16 => Value::F(bf16::from_ne_bytes([b[0], b[1]]).to_f64()),
        DataType::F32 => Value::F(f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))),
        DataType::F64 => Value::F(f64::from_ne_bytes(b[..8].try_into().unwrap_or([0; 8]))),
    }
}

/// Writes rank `rank`'s input for elements `first..first + buf.len()/size` into `buf`.
pub fn fill(dt: DataType, op: Option<RedOp>, rank: usize, first: usize, buf: &mut [u8]) {
    for (k, e) in buf.chunks_exact_mut(dt.size()).enumerate() {
        encode(dt, input(dt, op, rank, first + k), e);
    }
}

/// The reference: `op` over ranks `0..nranks` of element `i`, in f64 / i128.
fn reference(dt: DataType, op: RedOp, nranks: usize, i: usize) -> Value {
    let vals = (0..nranks).map(|r| input(dt, Some(op), r, i));
    match dt.is_float() {
        true => {
            let xs = vals.map(|v| match v {
                Value::F(x) => x,
                Value::I(x) => x as f64,
            });
            Value::F(match op {
                RedOp::Sum => xs.sum(),
                RedOp::Prod => xs.product(),
                RedOp::Min => xs.fold(f64::INFINITY, f64::min),
                RedOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
            })
        }
        false => {
            let xs = vals.map(|v| match v {
                Value::I(x) => x,
                Value::F(x) => x as i128,
            });
            Value::I(match op {
                RedOp::Sum => xs.fold(0i128, i128::wrapping_add),
                // Wrapping in the element width is a ring homomorphism, so reducing in i128
                // and truncating on compare gives what wrapping arithmetic in the type gives.
                RedOp::Prod => xs.fold(1i128, |a, b| wrap(dt, a.wrapping_mul(b))),
                RedOp::Min => xs.min().unwrap_or(0),
                RedOp::Max => xs.max().unwrap_or(0),
            })
        }
    }
}

fn wrap(dt: DataType, x: i128) -> i128 {
    match dt {
        DataType::U8 => i128::from(x as u8),
        DataType::I32 => i128::from(x as i32),
        DataType::I64 => i128::from(x as i64),
        _ => x,
    }
}

fn close(dt: DataType, op: RedOp, nranks: usize, got: Value, want: Value) -> bool {
    match (got, want) {
        (Value::I(g), Value::I(w)) => wrap(dt, g) == wrap(dt, w),
        (Value::F(g), Value::F(w)) => {
            // One rounding per reduction step, each at most eps relative.
            let tol = match op {
                RedOp::Sum | RedOp::Prod => dt.eps() * nranks as f64 * w.abs().max(1.0),
                RedOp::Min | RedOp::Max => 0.0,
            };
            (g - w).abs() <= tol
        }
        _ => false,
    }
}

/// What a buffer should hold after a collective: rank `rank`'s input, or the reduction over
/// all ranks, for each element.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// Element `first + k` equals rank `rank`'s input at that index (for op `op`'s data).
    Input {
        rank: usize,
        first: usize,
        op: Option<RedOp>,
    },
    /// Element `first + k` equals `op` over all `nranks` inputs at that index.
    Reduced {
        op: RedOp,
        nranks: usize,
        first: usize,
    },
}

/// Number of elements of `buf` that differ from `expect`.
pub fn count_wrong(dt: DataType, buf: &[u8], expect: Expect) -> u64 {
    let mut wrong = 0;
    for (k, e) in buf.chunks_exact(dt.size()).enumerate() {
        let got = decode(dt, e);
        let ok = match expect {
            Expect::Input { rank, first, op } => {
                let mut want = [0u8; 8];
                encode(dt, input(dt, op, rank, first + k), &mut want[..dt.size()]);
                e == &want[..dt.size()]
            }
            Expect::Reduced { op, nranks, first } => {
                close(dt, op, nranks, got, reference(dt, op, nranks, first + k))
            }
        };
        if !ok {
            wrong += 1;
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_reduction_matches_the_reference_for_every_type_and_op() {
        for dt in DataType::ALL {
            for op in RedOp::ALL {
                for n in [2usize, 3, 8] {
                    let count = 257;
                    let mut acc = vec![0u8; count * dt.size()];
                    fill(dt, Some(op), 0, 0, &mut acc);
                    for r in 1..n {
                        let mut x = vec![0u8; count * dt.size()];
                        fill(dt, Some(op), r, 0, &mut x);
                        reduce(dt, op, &mut acc, &x);
                    }
                    let expect = Expect::Reduced {
                        op,
                        nranks: n,
                        first: 0,
                    };
                    assert_eq!(count_wrong(dt, &acc, expect), 0, "{dt} {op} n={n}");
                    // A corrupted element is caught.
                    acc[dt.size() * 6 - 1] ^= 0x40; // high byte: sign/exponent
                    assert!(count_wrong(dt, &acc, expect) >= 1, "{dt} {op} n={n}");
                }
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for dt in DataType::ALL {
            assert_eq!(dt.name().parse::<DataType>(), Ok(dt));
        }
        for op in RedOp::ALL {
            assert_eq!(op.name().parse::<RedOp>(), Ok(op));
        }
    }
}
