//! The text form of one operator in a `[[preprocess]]` chain: `name` or `name(args)`.
//!
//! ```text
//! op    := ident [ "(" [ arg { "," arg } ] ")" ]
//! arg   := [ ident "=" ] value
//! value := number | ident | "[" [ value { "," value } ] "]" | "{" [ value ":" value { "," value ":" value } ] "}"
//! ```
//! Numbers keep their text, so a 64-bit salt or id is read exactly (not through `f64`).

/// A parsed argument value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number, as written (`-3`, `1e6`, `0.5`).
    Number(String),
    /// A bare word (`float`, `right`).
    Word(String),
    /// `[a, b, ...]`.
    List(Vec<Value>),
    /// `{k: v, ...}`.
    Map(Vec<(Value, Value)>),
}

/// One argument, positional (`name == None`) or named.
#[derive(Debug, Clone, PartialEq)]
pub struct Arg {
    /// `Some("salt")` for `salt = 7`.
    pub name: Option<String>,
    /// The value.
    pub value: Value,
}

/// An operator call as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The operator's name, lower case as written.
    pub name: String,
    /// Its arguments in order.
    pub args: Vec<Arg>,
}

/// Parses one operator; the error says where the text stops making sense.
pub fn parse_call(text: &str) -> Result<Call, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        at: 0,
    };
    p.skip_space();
    let name = p.ident().ok_or_else(|| p.expected("an operator name"))?;
    p.skip_space();
    let mut args = Vec::new();
    if p.eat(b'(') {
        p.skip_space();
        if !p.eat(b')') {
            loop {
                args.push(p.arg()?);
                p.skip_space();
                if p.eat(b')') {
                    break;
                }
                if !p.eat(b',') {
                    return Err(p.expected("',' or ')'"));
                }
            }
        }
    }
    p.skip_space();
    if p.at != p.s.len() {
        return Err(p.expected("the end of the operator"));
    }
    Ok(Call { name, args })
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn expected(&self, what: &str) -> String {
        let rest = String::from_utf8_lossy(&self.s[self.at.min(self.s.len())..]);
        if rest.is_empty() {
            format!("expected {what} at the end")
        } else {
            format!("expected {what} at `{rest}`")
        }
    }

    fn skip_space(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.s.get(self.at) == Some(&b) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        let start = self.at;
        while self.at < self.s.len()
            && (self.s[self.at].is_ascii_alphanumeric() || self.s[self.at] == b'_')
            && !(self.at == start && self.s[self.at].is_ascii_digit())
        {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    fn number(&mut self) -> Option<String> {
        let start = self.at;
        while self.at < self.s.len()
            && (self.s[self.at].is_ascii_alphanumeric() || b"+-._".contains(&self.s[self.at]))
        {
            // `1e-6`: a sign only at the start or right after an exponent mark.
            let b = self.s[self.at];
            if (b == b'+' || b == b'-')
                && self.at > start
                && !matches!(self.s[self.at - 1], b'e' | b'E')
            {
                break;
            }
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    fn arg(&mut self) -> Result<Arg, String> {
        self.skip_space();
        let save = self.at;
        if let Some(name) = self.ident() {
            self.skip_space();
            if self.eat(b'=') {
                let value = self.value()?;
                return Ok(Arg {
                    name: Some(name),
                    value,
                });
            }
            self.at = save;
        }
        Ok(Arg {
            name: None,
            value: self.value()?,
        })
    }

    fn value(&mut self) -> Result<Value, String> {
        self.skip_space();
        match self.s.get(self.at) {
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                self.skip_space();
                if self.eat(b']') {
                    return Ok(Value::List(items));
                }
                loop {
                    items.push(self.value()?);
                    self.skip_space();
                    if self.eat(b']') {
                        return Ok(Value::List(items));
                    }
                    if !self.eat(b',') {
                        return Err(self.expected("',' or ']'"));
                    }
                }
            }
            Some(b'{') => {
                self.at += 1;
                let mut pairs = Vec::new();
                self.skip_space();
                if self.eat(b'}') {
                    return Ok(Value::Map(pairs));
                }
                loop {
                    let k = self.value()?;
                    self.skip_space();
                    if !self.eat(b':') {
                        return Err(self.expected("':'"));
                    }
                    let v = self.value()?;
                    pairs.push((k, v));
                    self.skip_space();
                    if self.eat(b'}') {
                        return Ok(Value::Map(pairs));
                    }
                    if !self.eat(b',') {
                        return Err(self.expected("',' or '}'"));
                    }
                }
            }
            Some(b) if b.is_ascii_digit() || *b == b'-' || *b == b'+' || *b == b'.' => self
                .number()
                .map(Value::Number)
                .ok_or_else(|| self.expected("a number")),
            Some(_) => self
                .ident()
                .map(Value::Word)
                .ok_or_else(|| self.expected("a value")),
            None => Err(self.expected("a value")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(s: &str) -> Value {
        Value::Number(s.into())
    }

    #[test]
    fn calls_parse_with_positional_named_list_and_map_arguments() {
        assert_eq!(
            parse_call("log1p").unwrap(),
            Call {
                name: "log1p".into(),
                args: vec![]
            }
        );
        let c = parse_call(" clamp(0, 1e6) ").unwrap();
        assert_eq!(c.args[0].value, num("0"));
        assert_eq!(c.args[1].value, num("1e6"));
        let c = parse_call("sigrid_hash(salt=7, mod = 100000)").unwrap();
        assert_eq!(c.args[0].name.as_deref(), Some("salt"));
        assert_eq!(c.args[1].value, num("100000"));
        let c = parse_call("bucketize([1, 10,100])").unwrap();
        assert_eq!(
            c.args[0].value,
            Value::List(vec![num("1"), num("10"), num("100")])
        );
        let c = parse_call("map_id({1: 5, 2:6}, default=-1)").unwrap();
        assert_eq!(
            c.args[0].value,
            Value::Map(vec![(num("1"), num("5")), (num("2"), num("6"))])
        );
        assert_eq!(c.args[1].value, num("-1"));
        let c = parse_call("clamp(min=-1e-3)").unwrap();
        assert_eq!(c.args[0].value, num("-1e-3"));
        assert_eq!(
            parse_call("cast(float)").unwrap().args[0].value,
            Value::Word("float".into())
        );
    }

    #[test]
    fn bad_text_says_where() {
        assert!(parse_call("clamp(0 1)").unwrap_err().contains("at `1)`"));
        assert!(parse_call("bucketize([1, 2").unwrap_err().contains("end"));
        assert!(parse_call("(1)").unwrap_err().contains("operator name"));
        assert!(parse_call("log1p x")
            .unwrap_err()
            .contains("end of the operator"));
    }
}
