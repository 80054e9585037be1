//! Streaming lossy UTF-8: the fast path's whole decoder. Bytes go in piecewise; what comes out
//! concatenates to exactly `String::from_utf8_lossy` of all bytes, and no character is emitted
//! before all its bytes are in.

/// U+FFFD, which `from_utf8_lossy` writes for each maximal invalid subpart.
pub(crate) const REPLACEMENT: char = '\u{FFFD}';

/// The held-back tail: a valid but incomplete UTF-8 prefix (at most 3 bytes).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Utf8Tail {
    buf: [u8; 3],
    len: u8,
}

impl Utf8Tail {
    /// Number of bytes held back.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    /// Appends to `out` every character that `bytes` completes, replacing invalid sequences as
    /// `from_utf8_lossy` does, and holds back an incomplete final character.
    #[inline]
    pub(crate) fn push(&mut self, bytes: &[u8], out: &mut String) {
        let rest = if self.len > 0 {
            self.resolve(bytes, out)
        } else {
            bytes
        };
        if !rest.is_empty() {
            self.push_fresh(rest, out);
        }
    }

    /// Flushes a held-back incomplete character as one U+FFFD (as `from_utf8_lossy` renders an
    /// incomplete final sequence) and empties the tail.
    pub(crate) fn finish(&mut self, out: &mut String) {
        if self.len > 0 {
            out.push(REPLACEMENT);
            self.len = 0;
        }
    }

    /// Feeds bytes to the held prefix one at a time until it completes (one character out) or
    /// turns invalid (one U+FFFD for the held maximal subpart; the byte that broke it is not
    /// consumed). Returns the unconsumed bytes; the tail is empty unless all were consumed.
    fn resolve<'a>(&mut self, bytes: &'a [u8], out: &mut String) -> &'a [u8] {
        for (i, &b) in bytes.iter().enumerate() {
            let held = self.len as usize;
            let mut candidate = [0u8; 4];
            candidate[..held].copy_from_slice(&self.buf[..held]);
            candidate[held] = b;
            match std::str::from_utf8(&candidate[..=held]) {
                Ok(s) => {
                    out.push_str(s);
                    self.len = 0;
                    return &bytes[i + 1..];
                }
                // Still a valid prefix; a held prefix plus one byte is at most 3 bytes here,
                // since 4 valid bytes always complete a character.
                Err(e) if e.error_len().is_none() => {
                    self.buf[held] = b;
                    self.len += 1;
                }
                Err(_) => {
                    out.push(REPLACEMENT);
                    self.len = 0;
                    return &bytes[i..];
                }
            }
        }
        &[]
    }

    /// Decodes `bytes` with an empty tail, holding back an incomplete final character.
    fn push_fresh(&mut self, bytes: &[u8], out: &mut String) {
        if let Ok(s) = std::str::from_utf8(bytes) {
            out.push_str(s);
            return;
        }
        let mut chunks = bytes.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            out.push_str(chunk.valid());
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            let is_last = chunks.peek().is_none();
            if is_last && is_incomplete(invalid) {
                self.buf[..invalid.len()].copy_from_slice(invalid);
                self.len = invalid.len() as u8;
            } else {
                out.push(REPLACEMENT);
            }
        }
    }
}

/// True when `bytes` (a maximal invalid subpart) is a valid UTF-8 prefix cut short by the end
/// of input rather than an invalid sequence.
fn is_incomplete(bytes: &[u8]) -> bool {
    matches!(std::str::from_utf8(bytes), Err(e) if e.error_len().is_none())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn stream(chunks: &[Vec<u8>]) -> Vec<String> {
        let mut tail = Utf8Tail::default();
        let mut deltas = Vec::new();
        for chunk in chunks {
            let mut out = String::new();
            tail.push(chunk, &mut out);
            deltas.push(out);
        }
        let mut out = String::new();
        tail.finish(&mut out);
        deltas.push(out);
        deltas
    }

    /// Byte chunks biased toward UTF-8 fragments: pieces of real characters, lead and
    /// continuation bytes, and the bytes that are never valid.
    fn chunks() -> impl Strategy<Value = Vec<Vec<u8>>> {
        let byte = prop_oneof![
            0x00u8..0x80,
            0x80u8..0xC0,
            0xC0u8..0xF8,
            Just(0xE4),
            Just(0xF0),
            Just(0xFF),
        ];
        let piece = prop_oneof![
            any::<char>().prop_map(|c| c.to_string().into_bytes()),
            prop::collection::vec(byte, 0..4),
        ];
        let chunk = prop::collection::vec(piece, 0..4).prop_map(|p| p.concat());
        prop::collection::vec(chunk, 0..12)
    }

    proptest! {
        #[test]
        fn matches_from_utf8_lossy(chunks in chunks()) {
            let deltas = stream(&chunks);
            let all = chunks.concat();
            prop_assert_eq!(deltas.concat(), String::from_utf8_lossy(&all));
        }

        #[test]
        fn valid_text_never_shows_a_replacement(text in ".*", cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
            let bytes = text.as_bytes();
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            at.push(0);
            at.push(bytes.len());
            at.sort_unstable();
            let chunks: Vec<Vec<u8>> = at.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect();
            let deltas = stream(&chunks);
            prop_assert!(deltas.iter().all(|d| !d.contains(REPLACEMENT) || text.contains(REPLACEMENT)));
            prop_assert_eq!(deltas.concat(), text);
        }
    }

    #[test]
    fn holds_a_split_character_until_complete() {
        let mut tail = Utf8Tail::default();
        let mut out = String::new();
        tail.push(b"a\xE4", &mut out);
        assert_eq!((out.as_str(), tail.len()), ("a", 1));
        tail.push(b"\xB8", &mut out);
        assert_eq!((out.as_str(), tail.len()), ("a", 2));
        tail.push(b"\xADb", &mut out);
        assert_eq!((out.as_str(), tail.len()), ("a中b", 0));
    }

    #[test]
    fn a_broken_prefix_becomes_one_replacement() {
        let mut tail = Utf8Tail::default();
        let mut out = String::new();
        tail.push(b"\xE4\xB8", &mut out);
        tail.push(b"x\xF0", &mut out);
        assert_eq!(out, "\u{FFFD}x");
        tail.finish(&mut out);
        assert_eq!(out, "\u{FFFD}x\u{FFFD}");
        assert_eq!(out, String::from_utf8_lossy(b"\xE4\xB8x\xF0"));
    }
}
