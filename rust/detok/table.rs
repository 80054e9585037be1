//! Per-id facts computed once at load, so that the per-token path is array lookups: what kind of
//! token an id is, the string the tokenizer stores for it, and, for byte-level decoders, the raw
//! bytes it stands for.

use tokenizers::Tokenizer;

use crate::types::TokenId;

/// How an id takes part in decoding.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A model token or a non-special added token: decoded together with its neighbours.
    Normal,
    /// An added token marked special: dropped by `skip_special_tokens`, else its own segment.
    Special,
    /// No token has this id; `tokenizers` drops it when decoding, and so do we.
    Missing,
}

/// Strings by id, stored flat: `ends[i]` closes id `i`'s slice of `buf`.
#[derive(Default)]
pub(crate) struct FlatStrings {
    buf: String,
    ends: Vec<usize>,
}

impl FlatStrings {
    /// Appends the string of the next id.
    pub(crate) fn push(&mut self, s: &str) {
        self.buf.push_str(s);
        self.ends.push(self.buf.len());
    }

    /// The string of `id` ("" past the end).
    #[inline]
    pub(crate) fn get(&self, id: TokenId) -> &str {
        let i = id as usize;
        if i >= self.ends.len() {
            return "";
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.buf[start..self.ends[i]]
    }
}

/// The per-id tables.
pub(crate) struct TokenTable {
    kinds: Vec<Kind>,
    /// The token strings as the tokenizer stores them ("" when missing).
    strings: FlatStrings,
    /// Byte-level tokenizers only (else empty): the bytes the ByteLevel decoder maps each
    /// token to, `byte_ends[i]` closing id `i`'s slice.
    bytes: Vec<u8>,
    byte_ends: Vec<usize>,
}

impl TokenTable {
    /// Reads every id of `tokenizer` (model vocabulary and added tokens); with `byte_level`, also
    /// maps each token string to its bytes the way the ByteLevel decoder does.
    pub(crate) fn new(tokenizer: &Tokenizer, byte_level: bool) -> Self {
        let num_ids = tokenizer
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&id| id as usize + 1);
        let added = tokenizer.get_added_vocabulary();
        let mut table = TokenTable {
            kinds: Vec::with_capacity(num_ids),
            strings: FlatStrings::default(),
            bytes: Vec::new(),
            byte_ends: Vec::new(),
        };
        for id in 0..num_ids as TokenId {
            let token = tokenizer.id_to_token(id);
            // `tokenizers` decides "special" by the token's string, so we do too.
            let kind = match &token {
                None => Kind::Missing,
                Some(t) if added.is_special_token(t) => Kind::Special,
                Some(_) => Kind::Normal,
            };
            let token = token.unwrap_or_default();
            table.kinds.push(kind);
            table.strings.push(&token);
            if byte_level {
                byte_level_bytes(&token, &mut table.bytes);
                table.byte_ends.push(table.bytes.len());
            }
        }
        table
    }

    /// One past the largest id.
    #[inline]
    pub(crate) fn num_ids(&self) -> usize {
        self.kinds.len()
    }

    /// The kind of `id`; ids past the table are missing.
    #[inline]
    pub(crate) fn kind(&self, id: TokenId) -> Kind {
        self.kinds
            .get(id as usize)
            .copied()
            .unwrap_or(Kind::Missing)
    }

    /// The token string of `id` as the tokenizer stores it ("" when missing).
    #[inline]
    pub(crate) fn string(&self, id: TokenId) -> &str {
        self.strings.get(id)
    }

    /// The bytes of `id` for a byte-level table (empty otherwise or when missing).
    #[inline]
    pub(crate) fn bytes(&self, id: TokenId) -> &[u8] {
        let i = id as usize;
        if i >= self.byte_ends.len() {
            return &[];
        }
        let start = if i == 0 { 0 } else { self.byte_ends[i - 1] };
        &self.bytes[start..self.byte_ends[i]]
    }
}

/// Appends the bytes the ByteLevel decoder maps `token` to: each char through GPT-2's
/// bytes-to-unicode table, or, if any char is outside it (added tokens such as `a b`), the
/// token's own UTF-8 bytes, exactly as `tokenizers` does.
pub(crate) fn byte_level_bytes(token: &str, out: &mut Vec<u8>) {
    let start = out.len();
    for c in token.chars() {
        match byte_of_char(c) {
            Some(b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(token.as_bytes());
                return;
            }
        }
    }
}

/// GPT-2's `bytes_to_unicode` inverted: printable Latin-1 bytes stand for themselves, the other
/// 68 bytes were shifted to U+0100.. in increasing order.
fn byte_of_char(c: char) -> Option<u8> {
    let c = c as u32;
    match c {
        33..=126 | 161..=172 | 174..=255 => Some(c as u8),
        256..=323 => Some(SHIFTED_BYTES[(c - 256) as usize]),
        _ => None,
    }
}

const fn is_printable_byte(b: usize) -> bool {
    matches!(b, 33..=126 | 161..=172 | 174..=255)
}

/// The bytes GPT-2 moved to U+0100 + n, in order: 0..=32, 127..=160, 173.
const SHIFTED_BYTES: [u8; 68] = {
    let mut table = [0u8; 68];
    let (mut b, mut n) = (0usize, 0usize);
    while b < 256 {
        if !is_printable_byte(b) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifted_bytes_follow_gpt2() {
        assert_eq!(byte_of_char('Ġ'), Some(b' '));
        assert_eq!(byte_of_char('Ċ'), Some(b'\n'));
        assert_eq!(byte_of_char('Ā'), Some(0));
        assert_eq!(byte_of_char('ł'), Some(0xA0));
        assert_eq!(byte_of_char('Ń'), Some(0xAD));
        assert_eq!(byte_of_char('a'), Some(b'a'));
        assert_eq!(byte_of_char('中'), None);
        let mut seen = [false; 256];
        for c in (33u32..=323).filter_map(char::from_u32) {
            if let Some(b) = byte_of_char(c) {
                assert!(!seen[b as usize], "byte {b} mapped twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s), "every byte has a char");
    }

    #[test]
    fn tokens_outside_the_alphabet_keep_their_utf8() {
        let mut out = Vec::new();
        byte_level_bytes("ĠhiĊ", &mut out);
        assert_eq!(out, b" hi\n");
        out.clear();
        byte_level_bytes("a b", &mut out);
        assert_eq!(out, b"a b");
    }
}
