//! The operators (RAP Table 1 and what Criteo pipelines use), their arguments and their
//! typing rules. The contract of each is in `docs/preprocess.md`; the kernels are in
//! [`kernels`]. A `[[preprocess]]` graph (`elastrec-preprocess`) and a named feature's own
//! chain (`data.feature.ops`, [`crate::chain`]) use the same operators and kernels.

pub mod kernels;
pub mod syntax;
pub mod types;

use self::syntax::{parse_call, Arg, Call, Value};
use self::types::{Element, ValueType, NULL_ID, NULL_INT};

/// Most columns a one-hot or multi-hot vector may have: each becomes a dense input of the
/// bottom MLP, so a larger vocabulary belongs in an embedding table.
pub const MAX_ONE_HOT: usize = 4096;
/// Most borders a bucketize may have.
pub const MAX_BORDERS: usize = 65_536;

/// A number argument: its `f64` value and, when it is an integer, its exact value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Number {
    /// The value as a float.
    pub float: f64,
    /// The exact value when the text is an integer.
    pub int: Option<i128>,
}

impl Number {
    fn parse(text: &str) -> Result<Number, String> {
        if let Ok(i) = text.parse::<i128>() {
            return Ok(Number {
                float: i as f64,
                int: Some(i),
            });
        }
        let float: f64 = text
            .parse()
            .map_err(|_| format!("`{text}` is not a number"))?;
        if !float.is_finite() {
            return Err(format!("`{text}` is not a finite number"));
        }
        let int = (float.fract() == 0.0 && float.abs() < 1e38).then_some(float as i128);
        Ok(Number { float, int })
    }

    /// The value as an `int` element, if it is one.
    pub fn as_int(&self) -> Option<i64> {
        self.int
            .and_then(|i| i64::try_from(i).ok())
            .filter(|&i| i != NULL_INT)
    }

    /// The value as an `id` element, if it is one.
    pub fn as_id(&self) -> Option<u64> {
        self.int
            .and_then(|i| u64::try_from(i).ok())
            .filter(|&i| i != NULL_ID)
    }
}

/// One operator with its arguments checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `fill_null(v)`: nulls become `v`.
    FillNull(Number),
    /// `cast(int | float | id)`.
    Cast(Element),
    /// `clamp(min, max)`, either bound optional by name.
    Clamp {
        /// Lower bound.
        min: Option<Number>,
        /// Upper bound.
        max: Option<Number>,
    },
    /// `log1p`: `ln(1 + x)`.
    Log1p,
    /// `logit(eps = 1e-6)`: `ln(p / (1 - p))` with `p` clamped to `[eps, 1 - eps]`.
    Logit {
        /// Clamp margin.
        eps: f64,
    },
    /// `box_cox(lambda)`: `(x^λ - 1) / λ`, `ln x` when `λ = 0`; `x <= 0` is null.
    BoxCox {
        /// λ.
        lambda: f64,
    },
    /// `bucketize([b1, ..., bk])`: the number of borders `<= x`, in `0..=k`.
    Bucketize(Vec<f64>),
    /// `sigrid_hash(salt, mod)`: a salted 64-bit hash reduced to `0..mod`.
    SigridHash {
        /// Salt.
        salt: u64,
        /// Ids produced are `< modulus`.
        modulus: u64,
    },
    /// `first_x(x)` (alias `truncate`): the first `x` ids of a list.
    FirstX(usize),
    /// `ngram(n)`: the hashes of the list's `n` consecutive ids.
    Ngram(usize),
    /// `map_id({k: v, ...}, default = d)`: listed ids are replaced; others become `d`, or
    /// null without a default.
    MapId {
        /// `(from, to)` sorted by `from`.
        map: Vec<(u64, u64)>,
        /// What an unlisted id becomes.
        default: Option<u64>,
    },
    /// `onehot(n)`: an id in `0..n` becomes `n` floats with a 1 at the id.
    OneHot(usize),
    /// `multihot(n)`: a list of ids becomes `n` floats, 1 where an id of the list is.
    MultiHot(usize),
}

impl Op {
    /// Parses and checks the arguments of one operator.
    pub fn parse(text: &str) -> Result<Op, String> {
        let call = parse_call(text)?;
        let mut args = Args::new(&call);
        let op = match call.name.as_str() {
            "fill_null" => Op::FillNull(args.number("value")?),
            "cast" => Op::Cast(match args.word("to")?.as_str() {
                "int" => Element::Int,
                "float" => Element::Float,
                "id" => Element::Id,
                w => return Err(format!("cast to `{w}`: the types are int, float and id")),
            }),
            "clamp" => {
                let min = args.optional_number("min")?;
                let max = args.optional_number("max")?;
                match (min, max) {
                    (None, None) => return Err("clamp needs a min, a max or both".into()),
                    (Some(lo), Some(hi)) if lo.float > hi.float => {
                        return Err(format!("clamp: min {} is above max {}", lo.float, hi.float))
                    }
                    _ => {}
                }
                Op::Clamp { min, max }
            }
            "log1p" => Op::Log1p,
            "logit" => {
                let eps = args.optional_number("eps")?.map_or(1e-6, |n| n.float);
                if !(eps > 0.0 && eps < 0.5) {
                    return Err(format!("logit: eps must be in (0, 0.5), got {eps}"));
                }
                Op::Logit { eps }
            }
            "box_cox" | "boxcox" => Op::BoxCox {
                lambda: args.number("lambda")?.float,
            },
            "bucketize" => {
                let borders = args.list("borders")?;
                if borders.is_empty() || borders.len() > MAX_BORDERS {
                    return Err(format!(
                        "bucketize needs 1 to {MAX_BORDERS} borders, got {}",
                        borders.len()
                    ));
                }
                if let Some(w) = borders.windows(2).find(|w| w[0] >= w[1]) {
                    return Err(format!(
                        "bucketize: borders must be strictly increasing, but {} is followed by {}",
                        w[0], w[1]
                    ));
                }
                Op::Bucketize(borders)
            }
            "sigrid_hash" => {
                let salt = args.id("salt")?;
                let modulus = args.id("mod")?;
                if modulus == 0 {
                    return Err("sigrid_hash: mod must be at least 1".into());
                }
                Op::SigridHash { salt, modulus }
            }
            "first_x" | "truncate" => Op::FirstX(args.count("x")?),
            "ngram" => Op::Ngram(args.count("n")?),
            "map_id" => {
                let pairs = args.map("map")?;
                let default = args.optional_number("default")?;
                let default = match default {
                    None => None,
                    Some(d) => Some(d.as_id().ok_or_else(|| {
                        format!("map_id: default {} is not an id (0 .. 2^64-2)", d.float)
                    })?),
                };
                let mut map = pairs;
                map.sort_unstable();
                if let Some(w) = map.windows(2).find(|w| w[0].0 == w[1].0) {
                    return Err(format!("map_id: id {} is mapped twice", w[0].0));
                }
                Op::MapId { map, default }
            }
            "onehot" | "one_hot" => Op::OneHot(args.width("n")?),
            "multihot" | "multi_hot" => Op::MultiHot(args.width("n")?),
            other => {
                return Err(format!(
                    "unknown operator `{other}`; the operators are fill_null, cast, clamp, \
                     log1p, logit, box_cox, bucketize, sigrid_hash, first_x, ngram, map_id, \
                     onehot, multihot"
                ))
            }
        };
        args.finish()?;
        Ok(op)
    }

    /// The operator's name, as in the job file.
    pub fn name(&self) -> &'static str {
        match self {
            Op::FillNull(_) => "fill_null",
            Op::Cast(_) => "cast",
            Op::Clamp { .. } => "clamp",
            Op::Log1p => "log1p",
            Op::Logit { .. } => "logit",
            Op::BoxCox { .. } => "box_cox",
            Op::Bucketize(_) => "bucketize",
            Op::SigridHash { .. } => "sigrid_hash",
            Op::FirstX(_) => "first_x",
            Op::Ngram(_) => "ngram",
            Op::MapId { .. } => "map_id",
            Op::OneHot(_) => "onehot",
            Op::MultiHot(_) => "multihot",
        }
    }

    /// The type this operator produces from `input`, or why it does not apply.
    pub fn output(&self, input: ValueType) -> Result<ValueType, String> {
        use ValueType::*;
        let wrong = |takes: &str, hint: &str| {
            Err(format!("{} takes {takes}, not {input}{hint}", self.name()))
        };
        match (self, input) {
            (Op::FillNull(v), Int) => match v.as_int() {
                Some(_) => Ok(Int),
                None => Err(format!("fill_null: {} is not an int", v.float)),
            },
            (Op::FillNull(_), Float) => Ok(Float),
            (Op::FillNull(v), Id | Ids(_)) => match v.as_id() {
                Some(_) => Ok(input),
                None => Err(format!("fill_null: {} is not an id (0 .. 2^64-2)", v.float)),
            },
            (Op::FillNull(_), Floats(_)) => wrong("int, float, id or ids", ""),
            (Op::Cast(to), Int | Float | Id) => Ok(match to {
                Element::Int => Int,
                Element::Float => Float,
                Element::Id => Id,
            }),
            (Op::Cast(_), _) => wrong("int, float or id", ""),
            (Op::Clamp { min, max }, Int) => {
                for b in [min, max].into_iter().flatten() {
                    if b.as_int().is_none() {
                        return Err(format!("clamp: bound {} is not an int", b.float));
                    }
                }
                Ok(Int)
            }
            (Op::Clamp { .. }, Float) => Ok(Float),
            (Op::Clamp { min, max }, Id | Ids(_)) => {
                for b in [min, max].into_iter().flatten() {
                    if b.as_id().is_none() {
                        return Err(format!("clamp: bound {} is not an id", b.float));
                    }
                }
                Ok(input)
            }
            (Op::Clamp { .. }, Floats(_)) => wrong("int, float, id or ids", ""),
            (Op::Log1p | Op::Logit { .. } | Op::BoxCox { .. }, Int | Float) => Ok(Float),
            (Op::Log1p | Op::Logit { .. } | Op::BoxCox { .. }, _) => {
                wrong("int or float", "; cast(float) first")
            }
            (Op::Bucketize(_), Int | Float) => Ok(Id),
            (Op::Bucketize(_), _) => wrong("int or float", ""),
            (Op::SigridHash { .. } | Op::MapId { .. }, Id | Ids(_)) => Ok(input),
            (Op::SigridHash { .. } | Op::MapId { .. }, _) => {
                wrong("id or ids", "; bucketize or cast(id) first")
            }
            (Op::FirstX(x), Ids(w)) => Ok(Ids(w.min(*x))),
            (Op::FirstX(_), Id) => Ok(Id),
            (Op::FirstX(_), _) => wrong("ids or id", ""),
            (Op::Ngram(n), Ids(w)) if *n <= w => Ok(Ids(w - n + 1)),
            (Op::Ngram(n), Ids(w)) => Err(format!(
                "ngram({n}) needs a list of at least {n} ids, the input has {w}"
            )),
            (Op::Ngram(1), Id) => Ok(Id),
            (Op::Ngram(_), _) => wrong(
                "a list of ids",
                "; give several input columns, e.g. input = [\"C3\", \"C7\"]",
            ),
            (Op::OneHot(n), Id) => Ok(Floats(*n)),
            (Op::OneHot(_), _) => wrong("id", "; bucketize a number first"),
            (Op::MultiHot(n), Id | Ids(_)) => Ok(Floats(*n)),
            (Op::MultiHot(_), _) => wrong("ids or id", ""),
        }
    }

    /// How many distinct ids the output may hold (its embedding table's natural size),
    /// given the input's; `None` when unbounded.
    pub fn cardinality(&self, input: Option<u64>) -> Option<u64> {
        match self {
            Op::Bucketize(b) => Some(b.len() as u64 + 1),
            Op::SigridHash { modulus, .. } => Some(*modulus),
            Op::MapId { map, default } => {
                let top = map.iter().map(|&(_, to)| to).chain(*default).max()?;
                let mapped = top.saturating_add(1);
                // Without a default, unlisted ids become null, so only mapped ids remain.
                Some(mapped)
            }
            Op::FillNull(v) => input
                .zip(v.as_id())
                .map(|(c, v)| c.max(v.saturating_add(1))),
            Op::Clamp { max: Some(hi), .. } => {
                let top = hi.as_id()?.saturating_add(1);
                Some(input.map_or(top, |c| c.min(top)))
            }
            Op::Clamp { .. } | Op::FirstX(_) => input,
            Op::Cast(_) | Op::Ngram(_) | Op::Log1p | Op::Logit { .. } | Op::BoxCox { .. } => None,
            Op::OneHot(_) | Op::MultiHot(_) => None,
        }
    }
}

/// Positional and named arguments of one call, taken in order.
struct Args<'a> {
    op: &'a str,
    positional: std::collections::VecDeque<&'a Value>,
    named: Vec<(&'a str, &'a Value)>,
}

impl<'a> Args<'a> {
    fn new(call: &'a Call) -> Self {
        let mut positional = std::collections::VecDeque::new();
        let mut named = Vec::new();
        for Arg { name, value } in &call.args {
            match name {
                Some(n) => named.push((n.as_str(), value)),
                None => positional.push_back(value),
            }
        }
        Self {
            op: &call.name,
            positional,
            named,
        }
    }

    fn take(&mut self, name: &str) -> Option<&'a Value> {
        if let Some(i) = self.named.iter().position(|(n, _)| *n == name) {
            return Some(self.named.remove(i).1);
        }
        self.positional.pop_front()
    }

    fn need(&mut self, name: &str) -> Result<&'a Value, String> {
        self.take(name)
            .ok_or_else(|| format!("{} needs its `{name}` argument", self.op))
    }

    fn number_of(&self, name: &str, v: &Value) -> Result<Number, String> {
        match v {
            Value::Number(t) => Number::parse(t).map_err(|e| format!("{} {name}: {e}", self.op)),
            other => Err(format!(
                "{} {name}: expected a number, got {other:?}",
                self.op
            )),
        }
    }

    fn number(&mut self, name: &str) -> Result<Number, String> {
        let v = self.need(name)?;
        self.number_of(name, v)
    }

    fn optional_number(&mut self, name: &str) -> Result<Option<Number>, String> {
        // Only by name, or positionally when still available.
        match self.take(name) {
            Some(v) => self.number_of(name, v).map(Some),
            None => Ok(None),
        }
    }

    fn id(&mut self, name: &str) -> Result<u64, String> {
        let n = self.number(name)?;
        n.as_id()
            .ok_or_else(|| format!("{} {name}: {} is not an id (0 .. 2^64-2)", self.op, n.float))
    }

    fn count(&mut self, name: &str) -> Result<usize, String> {
        let n = self.number(name)?;
        match n.int {
            Some(i) if (1..=1024).contains(&i) => Ok(i as usize),
            _ => Err(format!(
                "{} {name}: expected 1 to 1024, got {}",
                self.op, n.float
            )),
        }
    }

    fn width(&mut self, name: &str) -> Result<usize, String> {
        let n = self.number(name)?;
        match n.int {
            Some(i) if (1..=MAX_ONE_HOT as i128).contains(&i) => Ok(i as usize),
            _ => Err(format!(
                "{} {name}: expected 1 to {MAX_ONE_HOT}, got {}",
                self.op, n.float
            )),
        }
    }

    fn word(&mut self, name: &str) -> Result<String, String> {
        match self.need(name)? {
            Value::Word(w) => Ok(w.clone()),
            other => Err(format!(
                "{} {name}: expected a word, got {other:?}",
                self.op
            )),
        }
    }

    fn list(&mut self, name: &str) -> Result<Vec<f64>, String> {
        match self.need(name)? {
            Value::List(items) => items
                .iter()
                .map(|v| self.number_of(name, v).map(|n| n.float))
                .collect(),
            other => Err(format!(
                "{} {name}: expected a list [..], got {other:?}",
                self.op
            )),
        }
    }

    fn map(&mut self, name: &str) -> Result<Vec<(u64, u64)>, String> {
        match self.need(name)? {
            Value::Map(pairs) => pairs
                .iter()
                .map(|(k, v)| {
                    let as_id = |v: &Value| {
                        let n = self.number_of(name, v)?;
                        n.as_id()
                            .ok_or_else(|| format!("{} {name}: {} is not an id", self.op, n.float))
                    };
                    Ok((as_id(k)?, as_id(v)?))
                })
                .collect(),
            other => Err(format!(
                "{} {name}: expected a map {{..}}, got {other:?}",
                self.op
            )),
        }
    }

    fn finish(self) -> Result<(), String> {
        if let Some((n, _)) = self.named.first() {
            return Err(format!("{} has no argument `{n}`", self.op));
        }
        if !self.positional.is_empty() {
            return Err(format!("{} was given too many arguments", self.op));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ValueType::*;

    #[test]
    fn operators_parse_and_type() {
        let op = Op::parse("clamp(0, 1e6)").unwrap();
        assert_eq!(op.output(Int).unwrap(), Int);
        assert_eq!(
            Op::parse("clamp(min=0)").unwrap().output(Float).unwrap(),
            Float
        );
        assert_eq!(Op::parse("log1p").unwrap().output(Int).unwrap(), Float);
        let b = Op::parse("bucketize([1,10,100])").unwrap();
        assert_eq!(b.output(Float).unwrap(), Id);
        assert_eq!(b.cardinality(None), Some(4));
        let h = Op::parse("sigrid_hash(salt=7, mod=100000)").unwrap();
        assert_eq!(
            h,
            Op::SigridHash {
                salt: 7,
                modulus: 100_000
            }
        );
        assert_eq!(h.output(Ids(3)).unwrap(), Ids(3));
        assert_eq!(
            Op::parse("ngram(2)").unwrap().output(Ids(3)).unwrap(),
            Ids(2)
        );
        assert_eq!(
            Op::parse("first_x(2)").unwrap().output(Ids(5)).unwrap(),
            Ids(2)
        );
        assert_eq!(
            Op::parse("onehot(4)").unwrap().output(Id).unwrap(),
            Floats(4)
        );
        let m = Op::parse("map_id({3: 1, 1: 2}, default=0)").unwrap();
        assert_eq!(
            m,
            Op::MapId {
                map: vec![(1, 2), (3, 1)],
                default: Some(0)
            }
        );
        assert_eq!(m.cardinality(None), Some(3));
        assert_eq!(Op::parse("cast(id)").unwrap().output(Float).unwrap(), Id);
    }

    #[test]
    fn wrong_types_and_arguments_are_refused_with_the_reason() {
        let e = Op::parse("log1p").unwrap().output(Id).unwrap_err();
        assert!(e.contains("log1p takes int or float, not id"), "{e}");
        let e = Op::parse("sigrid_hash(1, 10)")
            .unwrap()
            .output(Float)
            .unwrap_err();
        assert!(e.contains("not float") && e.contains("bucketize"), "{e}");
        let e = Op::parse("bucketize([1, 10, 5])").unwrap_err();
        assert!(
            e.contains("strictly increasing") && e.contains("10 is followed by 5"),
            "{e}"
        );
        assert!(Op::parse("frobnicate")
            .unwrap_err()
            .contains("unknown operator `frobnicate`"));
        assert!(Op::parse("clamp(5, 1)").unwrap_err().contains("above max"));
        assert!(Op::parse("sigrid_hash(salt=1)")
            .unwrap_err()
            .contains("`mod`"));
        assert!(Op::parse("log1p(3)").unwrap_err().contains("too many"));
        assert!(Op::parse("clamp(min=1, hi=3)")
            .unwrap_err()
            .contains("no argument `hi`"));
        assert!(Op::parse("sigrid_hash(-1, 10)")
            .unwrap_err()
            .contains("not an id"));
        let e = Op::parse("ngram(3)").unwrap().output(Ids(2)).unwrap_err();
        assert!(e.contains("at least 3"), "{e}");
        let e = Op::parse("fill_null(0.5)")
            .unwrap()
            .output(Int)
            .unwrap_err();
        assert!(e.contains("not an int"), "{e}");
        assert!(Op::parse("map_id({1: 2, 1: 3})")
            .unwrap_err()
            .contains("mapped twice"));
        assert!(Op::parse("onehot(0)").unwrap_err().contains("1 to 4096"));
    }
}
