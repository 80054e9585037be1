//! A small strict JSON reader that builds `Raw`, so that tests (and the bench, which includes
//! this file) can paste request bodies as JSON. Integers without a fraction or exponent stay
//! exact (`Raw::Int`), as a real decoder's output reaches `validate`.

use super::Raw;

/// Parses `text` as one JSON value; panics with the byte offset on malformed input.
pub fn parse(text: &str) -> Raw {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let value = p.value();
    p.ws();
    assert_eq!(p.i, p.s.len(), "trailing characters at byte {}", p.i);
    value
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        let hit = self.s.get(self.i) == Some(&b);
        if hit {
            self.i += 1;
        }
        hit
    }

    fn expect(&mut self, b: u8) {
        assert!(self.eat(b), "expected {:?} at byte {}", b as char, self.i);
    }

    fn value(&mut self) -> Raw {
        self.ws();
        match self.s.get(self.i).copied() {
            Some(b'{') => self.map(),
            Some(b'[') => self.list(),
            Some(b'"') => Raw::Str(self.string()),
            Some(b't') => self.word("true", Raw::Bool(true)),
            Some(b'f') => self.word("false", Raw::Bool(false)),
            Some(b'n') => self.word("null", Raw::Null),
            _ => self.number(),
        }
    }

    fn word(&mut self, word: &str, value: Raw) -> Raw {
        assert!(
            self.s[self.i..].starts_with(word.as_bytes()),
            "bad literal at {}",
            self.i
        );
        self.i += word.len();
        value
    }

    fn map(&mut self) -> Raw {
        self.expect(b'{');
        let mut entries = Vec::new();
        if self.eat(b'}') {
            return Raw::Map(entries);
        }
        loop {
            self.ws();
            let key = self.string();
            self.expect(b':');
            entries.push((key, self.value()));
            if self.eat(b'}') {
                return Raw::Map(entries);
            }
            self.expect(b',');
        }
    }

    fn list(&mut self) -> Raw {
        self.expect(b'[');
        let mut items = Vec::new();
        if self.eat(b']') {
            return Raw::List(items);
        }
        loop {
            items.push(self.value());
            if self.eat(b']') {
                return Raw::List(items);
            }
            self.expect(b',');
        }
    }

    fn hex4(&mut self) -> u32 {
        let digits = std::str::from_utf8(&self.s[self.i..self.i + 4]).expect("ascii");
        self.i += 4;
        u32::from_str_radix(digits, 16).expect("four hex digits")
    }

    fn string(&mut self) -> String {
        assert_eq!(self.s[self.i], b'"', "expected a string at {}", self.i);
        self.i += 1;
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.s[self.i] != b'"' && self.s[self.i] != b'\\' {
                self.i += 1;
            }
            out.push_str(std::str::from_utf8(&self.s[start..self.i]).expect("utf-8"));
            if self.s[self.i] == b'"' {
                self.i += 1;
                return out;
            }
            self.i += 1;
            let esc = self.s[self.i];
            self.i += 1;
            match esc {
                b'n' => out.push('\n'),
                b't' => out.push('\t'),
                b'r' => out.push('\r'),
                b'b' => out.push('\u{8}'),
                b'f' => out.push('\u{c}'),
                b'u' => {
                    let mut c = self.hex4();
                    if (0xD800..0xDC00).contains(&c) && self.s[self.i..].starts_with(b"\\u") {
                        self.i += 2;
                        c = 0x10000 + ((c - 0xD800) << 10) + (self.hex4() - 0xDC00);
                    }
                    out.push(char::from_u32(c).expect("a scalar value"));
                }
                other => out.push(other as char),
            }
        }
    }

    fn number(&mut self) -> Raw {
        let start = self.i;
        while self.i < self.s.len() && b"+-0123456789.eE".contains(&self.s[self.i]) {
            self.i += 1;
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).expect("ascii");
        assert!(!text.is_empty(), "expected a value at byte {start}");
        if text.contains(['.', 'e', 'E']) {
            Raw::Float(text.parse().expect("a JSON number"))
        } else {
            Raw::Int(text.parse().expect("a JSON integer"))
        }
    }
}
