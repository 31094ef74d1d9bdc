//! Text an agent (or a store it wrote) hands idem, made safe to show an operator and
//! checked before it becomes a name: control characters, bidi controls and invisible
//! characters are shown as JSON escapes (`\n`, `\u001b`) in terminal output, and
//! refused in keys, run ids, namespaces and input fingerprints.
//!
//! **Why JSON's escapes.** Agents are written in more than one language: an escape
//! spelt the way one language writes it (Rust's `\u{1b}`, Python's `\x1b`) reads as
//! noise to the others, while every one of them, and every operator's tool, reads
//! JSON's. Characters above U+FFFF are written as JSON writes them, as two `\uXXXX`
//! (a surrogate pair).
//!
//! A terminal obeys escape sequences (ESC, and the C1 controls some terminals also take
//! for them): an agent that could print one could clear the operator's screen, rewrite
//! earlier lines or retitle the window. Bidi controls reorder what is displayed, and
//! zero-width characters make two different keys look alike, so an operator could be
//! led to resolve the wrong key. What a character is, is decided by one table,
//! [`hidden_char`]:
//!
//! | class | code points |
//! |---|---|
//! | control | C0 (U+0000–U+001F, tab and newline included), U+007F, C1 (U+0080–U+009F) |
//! | bidi control | U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069 |
//! | invisible | U+00AD, U+034F, U+115F, U+1160, U+17B4, U+17B5, U+180E, U+200B–U+200D, U+2028, U+2029, U+2060–U+2065, U+206A–U+206F, U+3164, U+FEFF, U+FFA0, U+FFF0–U+FFFB, U+13430–U+1343F, U+1BCA0–U+1BCA3, U+1D173–U+1D17A, U+E0000–U+E007F (tags), U+E0080–U+E00FF, U+E01F0–U+E0FFF |
//! | variation selector | U+180B–U+180D, U+180F, U+FE00–U+FE0F, U+E0100–U+E01EF |
//!
//! The invisible class is Unicode's `Default_Ignorable_Code_Point` set (characters a
//! renderer shows as nothing) without the variation selectors, plus the format
//! characters that are not in it but render as nothing too (the interlinear annotation
//! controls, the Egyptian hieroglyph format controls) and the line and paragraph
//! separators, which some terminals and editors break lines at.
//!
//! **Variation selectors** are refused in names but kept in displayed text. A variation
//! selector only picks the glyph of the character before it (text or emoji style, a
//! CJK variant): it cannot reorder text, hide a character or drive the terminal, and
//! escaping it would garble ordinary output such as `❤️` (U+2764 U+FE0F). After a
//! character without variants, though, it shows as nothing, so `key` and `key` plus
//! U+FE00 would look the same: in a name it is as invisible as a zero-width space.
//!
//! **Why a hand-written table.** No crate draws this line: crates with Unicode property
//! tables answer neighbouring questions (identifier profiles and confusables, the bidi
//! algorithm, general categories) with far larger tables than the ~45 ranges needed
//! here, and none treats variation selectors as this module does. The table is short,
//! sorted, checked by the tests against `char::is_control` and every code point named
//! above, and changes only when Unicode adds invisible characters, which is rare.
//!
//! A backslash is not escaped: `\u202e` typed as six ASCII characters and a real
//! U+202E escaped look the same. Escaping every backslash would make paths and JSON in
//! error texts hard to read, and names (keys, run ids) cannot hold the real character.

use std::borrow::Cow;
use std::fmt;
use std::fmt::Write as _;

/// What kind of character [`hidden_char`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CharClass {
    /// A C0 or C1 control, or DEL: terminals act on them.
    Control,
    /// A bidi control: changes the order in which text is displayed.
    Bidi,
    /// Shown as nothing (zero-width characters, fillers, tags, separators).
    Invisible,
    /// Picks the glyph of the previous character; shown as nothing on its own.
    VariationSelector,
}

impl CharClass {
    fn describe(self) -> &'static str {
        match self {
            CharClass::Control => "a control character",
            CharClass::Bidi => "a bidi control",
            CharClass::Invisible => "an invisible character",
            CharClass::VariationSelector => "a variation selector, invisible on its own",
        }
    }
}

/// A character that a terminal would not show as itself: what it is and its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HiddenChar {
    /// The character.
    pub ch: char,
    /// Its class.
    pub class: CharClass,
    /// Its Unicode name, or the name of its group.
    pub name: &'static str,
}

impl fmt::Display for HiddenChar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "U+{:04X} {}, {}",
            u32::from(self.ch),
            self.name,
            self.class.describe()
        )
    }
}

use CharClass::{Bidi, Control, Invisible, VariationSelector as Selector};

/// Every hidden character, as sorted, disjoint, inclusive ranges.
const TABLE: &[(u32, u32, CharClass, &str)] = &[
    (0x0000, 0x001F, Control, "C0 CONTROL"),
    (0x007F, 0x007F, Control, "DELETE"),
    (0x0080, 0x009F, Control, "C1 CONTROL"),
    (0x00AD, 0x00AD, Invisible, "SOFT HYPHEN"),
    (0x034F, 0x034F, Invisible, "COMBINING GRAPHEME JOINER"),
    (0x061C, 0x061C, Bidi, "ARABIC LETTER MARK"),
    (0x115F, 0x1160, Invisible, "HANGUL FILLER"),
    (0x17B4, 0x17B5, Invisible, "KHMER INHERENT VOWEL"),
    (
        0x180B,
        0x180D,
        Selector,
        "MONGOLIAN FREE VARIATION SELECTOR",
    ),
    (0x180E, 0x180E, Invisible, "MONGOLIAN VOWEL SEPARATOR"),
    (
        0x180F,
        0x180F,
        Selector,
        "MONGOLIAN FREE VARIATION SELECTOR",
    ),
    (0x200B, 0x200B, Invisible, "ZERO WIDTH SPACE"),
    (0x200C, 0x200C, Invisible, "ZERO WIDTH NON-JOINER"),
    (0x200D, 0x200D, Invisible, "ZERO WIDTH JOINER"),
    (0x200E, 0x200E, Bidi, "LEFT-TO-RIGHT MARK"),
    (0x200F, 0x200F, Bidi, "RIGHT-TO-LEFT MARK"),
    (0x2028, 0x2028, Invisible, "LINE SEPARATOR"),
    (0x2029, 0x2029, Invisible, "PARAGRAPH SEPARATOR"),
    (0x202A, 0x202A, Bidi, "LEFT-TO-RIGHT EMBEDDING"),
    (0x202B, 0x202B, Bidi, "RIGHT-TO-LEFT EMBEDDING"),
    (0x202C, 0x202C, Bidi, "POP DIRECTIONAL FORMATTING"),
    (0x202D, 0x202D, Bidi, "LEFT-TO-RIGHT OVERRIDE"),
    (0x202E, 0x202E, Bidi, "RIGHT-TO-LEFT OVERRIDE"),
    (0x2060, 0x2060, Invisible, "WORD JOINER"),
    (0x2061, 0x2064, Invisible, "INVISIBLE MATHEMATICAL OPERATOR"),
    (0x2065, 0x2065, Invisible, "RESERVED DEFAULT-IGNORABLE"),
    (0x2066, 0x2066, Bidi, "LEFT-TO-RIGHT ISOLATE"),
    (0x2067, 0x2067, Bidi, "RIGHT-TO-LEFT ISOLATE"),
    (0x2068, 0x2068, Bidi, "FIRST STRONG ISOLATE"),
    (0x2069, 0x2069, Bidi, "POP DIRECTIONAL ISOLATE"),
    (0x206A, 0x206F, Invisible, "DEPRECATED FORMAT CHARACTER"),
    (0x3164, 0x3164, Invisible, "HANGUL FILLER"),
    (0xFE00, 0xFE0F, Selector, "VARIATION SELECTOR"),
    (0xFEFF, 0xFEFF, Invisible, "ZERO WIDTH NO-BREAK SPACE"),
    (0xFFA0, 0xFFA0, Invisible, "HALFWIDTH HANGUL FILLER"),
    (0xFFF0, 0xFFF8, Invisible, "RESERVED DEFAULT-IGNORABLE"),
    (0xFFF9, 0xFFFB, Invisible, "INTERLINEAR ANNOTATION CONTROL"),
    (
        0x13430,
        0x1343F,
        Invisible,
        "EGYPTIAN HIEROGLYPH FORMAT CONTROL",
    ),
    (0x1BCA0, 0x1BCA3, Invisible, "SHORTHAND FORMAT CONTROL"),
    (0x1D173, 0x1D17A, Invisible, "MUSICAL SYMBOL FORMAT CONTROL"),
    (0xE0000, 0xE007F, Invisible, "TAG CHARACTER"),
    (0xE0080, 0xE00FF, Invisible, "RESERVED DEFAULT-IGNORABLE"),
    (0xE0100, 0xE01EF, Selector, "VARIATION SELECTOR SUPPLEMENT"),
    (0xE01F0, 0xE0FFF, Invisible, "RESERVED DEFAULT-IGNORABLE"),
];

/// What `ch` is, if a terminal would not show it as itself: a control, a bidi control,
/// an invisible character or a variation selector.
///
/// ```
/// use idem::text::{CharClass, hidden_char};
///
/// assert_eq!(hidden_char('\u{202E}').map(|h| h.class), Some(CharClass::Bidi));
/// assert_eq!(hidden_char('\u{1b}').map(|h| h.class), Some(CharClass::Control));
/// assert_eq!(hidden_char('é'), None);
/// ```
pub fn hidden_char(ch: char) -> Option<HiddenChar> {
    let c = u32::from(ch);
    // Everything from U+0020 to U+007E, the bulk of real text, is visible.
    if (0x20..0x7F).contains(&c) {
        return None;
    }
    let i = TABLE.partition_point(|&(_, end, _, _)| end < c);
    let &(start, _, class, name) = TABLE.get(i)?;
    (start <= c).then_some(HiddenChar { ch, class, name })
}

/// A character a name must not hold, and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvisibleChar {
    /// The character.
    pub hidden: HiddenChar,
    /// Its byte offset in the text.
    pub offset: usize,
}

impl fmt::Display for InvisibleChar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, at byte {}", self.hidden, self.offset)
    }
}

impl std::error::Error for InvisibleChar {}

/// Checks that `name` (a key, a run id, a namespace, a fingerprint) holds nothing a
/// reader could not see: no control, bidi control, invisible character or variation
/// selector. Names are what an operator reads and types back (`idem resolve`): two that
/// look the same must be the same.
///
/// ```
/// use idem::text::check_visible;
///
/// assert!(check_visible("order-17/charge").is_ok());
/// let err = check_visible("pay\u{200B}ment").unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "U+200B ZERO WIDTH SPACE, an invisible character, at byte 3"
/// );
/// ```
pub fn check_visible(name: &str) -> Result<(), InvisibleChar> {
    match name
        .char_indices()
        .find_map(|(offset, ch)| hidden_char(ch).map(|hidden| InvisibleChar { hidden, offset }))
    {
        Some(invisible) => Err(invisible),
        None => Ok(()),
    }
}

/// `text` as a terminal should show it on one line: every control character (newline
/// and tab included), bidi control and invisible character written as JSON writes it
/// (`\n`, `\r`, `\t`, else `\uXXXX`), so that it is seen instead of obeyed. Variation selectors stay (see the module docs).
/// Borrows when there is nothing to escape.
///
/// ```
/// use idem::text::escape_for_terminal;
///
/// assert_eq!(escape_for_terminal("\u{1b}[2Jok\u{202E}"), r"\u001b[2Jok\u202e");
/// assert_eq!(escape_for_terminal("a\nb"), r"a\nb");
/// ```
pub fn escape_for_terminal(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// Like [`escape_for_terminal`], but keeps newlines and tabs, for text shown as lines
/// (an agent's stderr, a log). A carriage return is still escaped: it would let a line
/// overwrite itself.
///
/// ```
/// use idem::text::escape_lines_for_terminal;
///
/// assert_eq!(escape_lines_for_terminal("a\tb\nc\rd"), "a\tb\nc\\rd");
/// ```
pub fn escape_lines_for_terminal(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

/// [`escape_lines_for_terminal`] for bytes that may not be UTF-8: each byte that is not
/// part of a valid UTF-8 sequence is written as `\xHH` (a terminal could take a lone
/// byte such as 0x9B for a control).
///
/// ```
/// use idem::text::escape_bytes_lines_for_terminal;
///
/// assert_eq!(escape_bytes_lines_for_terminal(b"ok\x9b2J\n"), "ok\\x9B2J\n");
/// ```
pub fn escape_bytes_lines_for_terminal(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return escape_lines_for_terminal(text);
    }
    let mut out = String::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        push_escaped(&mut out, chunk.valid(), true);
        for byte in chunk.invalid() {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\x{byte:02X}");
        }
    }
    Cow::Owned(out)
}

fn needs_escape(ch: char, keep_lines: bool) -> bool {
    if keep_lines && matches!(ch, '\n' | '\t') {
        return false;
    }
    hidden_char(ch).is_some_and(|h| h.class != CharClass::VariationSelector)
}

/// [`escape_lines_for_terminal`] when `keep_lines`, else [`escape_for_terminal`].
pub fn escape(text: &str, keep_lines: bool) -> Cow<'_, str> {
    if !text.chars().any(|ch| needs_escape(ch, keep_lines)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    push_escaped(&mut out, text, keep_lines);
    Cow::Owned(out)
}

fn push_escaped(out: &mut String, text: &str, keep_lines: bool) {
    for ch in text.chars() {
        if needs_escape(ch, keep_lines) {
            push_json_escape(out, ch);
        } else {
            out.push(ch);
        }
    }
}

/// `ch` as a JSON string writes it escaped: `\n`, `\r`, `\t`, else `\uXXXX` for each
/// UTF-16 unit.
fn push_json_escape(out: &mut String, ch: char) {
    match ch {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        _ => {
            let mut units = [0u16; 2];
            for unit in ch.encode_utf16(&mut units) {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
}

/// `text` escaped for one line and in double quotes, for a name inside a message.
///
/// ```
/// assert_eq!(idem::text::quoted("a\u{202E}\"b"), r#""a\u202e\"b""#);
/// ```
pub fn quoted(text: &str) -> String {
    format!("\"{}\"", escape_for_terminal(text).replace('"', "\\\""))
}

/// `value` as compact JSON in which every character [`escape_for_terminal`] escapes is
/// written as a JSON `\uXXXX` escape (surrogate pairs above U+FFFF). serde_json escapes
/// only U+0000–U+001F, so DEL, the C1 controls, bidi controls and invisible characters
/// would otherwise reach the terminal raw. The document decodes to the same value.
///
/// ```
/// let doc = idem::text::json_for_terminal(&serde_json::json!({"k": "a\u{202E}b\u{9b}"}));
/// assert_eq!(doc, r#"{"k":"a\u202eb\u009b"}"#);
/// ```
pub fn json_for_terminal<T: serde::Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, TerminalJson);
    match value.serialize(&mut ser) {
        // The formatter writes only ASCII and valid UTF-8 taken from `&str`s.
        Ok(()) => String::from_utf8_lossy(&out).into_owned(),
        // Only a failing `Serialize` impl gets here (never serde_json::Value); what
        // was written is dropped rather than shown half-finished.
        Err(e) => format!("{{\"error\":\"cannot encode JSON: {e}\"}}"),
    }
}

/// serde_json's compact formatter, with the extra escapes of [`json_for_terminal`].
struct TerminalJson;

impl serde_json::ser::Formatter for TerminalJson {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, ch) in fragment.char_indices() {
            if needs_escape(ch, false) {
                writer.write_all(&fragment.as_bytes()[start..i])?;
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    write!(writer, "\\u{unit:04x}")?;
                }
                start = i + ch.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The characters the brief of this module names, each of which must be caught.
    const NAMED: &[char] = &[
        '\u{0}',
        '\u{7}',
        '\t',
        '\n',
        '\r',
        '\u{1b}',
        '\u{7f}',
        '\u{80}',
        '\u{85}',
        '\u{9b}',
        '\u{9f}',
        '\u{ad}',
        '\u{61c}',
        '\u{180e}',
        '\u{200b}',
        '\u{200c}',
        '\u{200d}',
        '\u{200e}',
        '\u{200f}',
        '\u{2028}',
        '\u{2029}',
        '\u{202a}',
        '\u{202b}',
        '\u{202c}',
        '\u{202d}',
        '\u{202e}',
        '\u{2060}',
        '\u{2061}',
        '\u{2062}',
        '\u{2063}',
        '\u{2064}',
        '\u{2066}',
        '\u{2067}',
        '\u{2068}',
        '\u{2069}',
        '\u{feff}',
        '\u{fff9}',
        '\u{fffa}',
        '\u{fffb}',
        '\u{e0000}',
        '\u{e0001}',
        '\u{e0041}',
        '\u{e007f}',
    ];

    #[test]
    fn the_table_is_sorted_and_disjoint() {
        for pair in TABLE.windows(2) {
            assert!(pair[0].0 <= pair[0].1, "{:X?}", pair[0]);
            assert!(
                pair[0].1 < pair[1].0,
                "{:X?} overlaps {:X?}",
                pair[0],
                pair[1]
            );
        }
    }

    #[test]
    fn every_named_character_is_hidden_and_escaped() {
        for &ch in NAMED {
            let hidden = hidden_char(ch).unwrap_or_else(|| panic!("U+{:04X}", ch as u32));
            assert_ne!(hidden.class, CharClass::VariationSelector);
            let escaped = escape_for_terminal(&ch.to_string()).into_owned();
            // What a JSON parser reads back as the character itself.
            let json: String = serde_json::from_str(&format!("\"{escaped}\"")).unwrap();
            assert_eq!(json, ch.to_string(), "{escaped}");
            assert!(escaped.is_ascii() && escaped.starts_with('\\'), "{escaped}");
            assert!(check_visible(&format!("a{ch}")).is_err());
        }
        let bidi = ['\u{61c}', '\u{200e}', '\u{202e}', '\u{2066}', '\u{2069}'];
        assert!(
            bidi.iter()
                .all(|&c| hidden_char(c).unwrap().class == CharClass::Bidi)
        );
    }

    #[test]
    fn every_control_of_std_is_hidden() {
        for ch in (0..=0x10FFFF).filter_map(char::from_u32) {
            if ch.is_control() {
                assert_eq!(hidden_char(ch).map(|h| h.class), Some(CharClass::Control));
            }
        }
    }

    #[test]
    fn visible_text_is_borrowed_as_it_is() {
        for text in ["", "plain", "ünïcödé 漢字 ❤️ emoji 👍🏽", "C:\\path\\u{202E}"] {
            assert!(matches!(escape_for_terminal(text), Cow::Borrowed(t) if t == text));
        }
        assert!(check_visible("ünïcödé/漢字-ok").is_ok());
    }

    #[test]
    fn variation_selectors_are_shown_but_refused_in_names() {
        assert_eq!(escape_for_terminal("❤\u{fe0f}"), "❤\u{fe0f}");
        let err = check_visible("key\u{fe00}").unwrap_err();
        assert_eq!(err.hidden.class, CharClass::VariationSelector);
        assert_eq!(
            err.to_string(),
            "U+FE00 VARIATION SELECTOR, a variation selector, invisible on its own, at byte 3"
        );
    }

    #[test]
    fn names_report_the_first_hidden_character_and_its_offset() {
        let err = check_visible("é\u{202e}x\u{200b}").unwrap_err();
        assert_eq!(err.offset, 2);
        assert_eq!(
            err.to_string(),
            "U+202E RIGHT-TO-LEFT OVERRIDE, a bidi control, at byte 2"
        );
        assert_eq!(
            check_visible("a\u{1b}").unwrap_err().to_string(),
            "U+001B C0 CONTROL, a control character, at byte 1"
        );
    }

    #[test]
    fn lines_keep_newlines_and_tabs_only() {
        assert_eq!(
            escape_lines_for_terminal("a\tb\r\n\u{1b}[1m\u{2028}"),
            "a\tb\\r\n\\u001b[1m\\u2028"
        );
        assert_eq!(
            escape_for_terminal("Traceback:\n\tline\u{e0041}"),
            "Traceback:\\n\\tline\\udb40\\udc41"
        );
        assert_eq!(
            escape_bytes_lines_for_terminal(b"\xe2\x80\xaeA\xff\n\xe2\x80"),
            "\\u202eA\\xFF\n\\xE2\\x80"
        );
    }

    #[test]
    fn json_decodes_to_the_same_value() {
        let value = serde_json::json!({
            "key": "a\u{1b}[31m\u{7f}\u{9b}\u{202e}\u{200b}\u{e0041}\u{fe0f}\"\\",
            "n": 1,
        });
        let doc = json_for_terminal(&value);
        assert!(
            doc.chars().all(|c| c.is_ascii() || c == '\u{fe0f}'),
            "{doc}"
        );
        assert!(
            doc.contains(r"\u001b[31m\u007f\u009b\u202e\u200b\udb40\udc41"),
            "{doc}"
        );
        let back: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(back, value);
    }

    /// Any character, with the hidden ones (and their neighbours) far more likely.
    fn tricky_char() -> impl Strategy<Value = char> {
        let near_table =
            prop::sample::select(TABLE.to_vec()).prop_flat_map(|(start, end, _, _)| {
                (start.saturating_sub(1)..=end + 1).prop_filter_map("a char", char::from_u32)
            });
        prop_oneof![
            any::<char>(),
            near_table,
            prop::sample::select(NAMED.to_vec())
        ]
    }

    fn tricky_text() -> impl Strategy<Value = String> {
        prop::collection::vec(tricky_char(), 0..40).prop_map(|cs| cs.into_iter().collect())
    }

    proptest! {
        #[test]
        fn escaped_text_holds_no_control_bidi_or_invisible_char(text in tricky_text()) {
            let one_line = escape_for_terminal(&text);
            prop_assert!(one_line.chars().all(|c| !needs_escape(c, false)), "{one_line:?}");
            // Independently of the table: no control at all, none of the named ones.
            prop_assert!(one_line.chars().all(|c| !c.is_control() && !NAMED.contains(&c)));
            prop_assert!(!one_line.contains(['\n', '\t']));
            let lines = escape_lines_for_terminal(&text);
            prop_assert!(lines.chars().all(|c| !needs_escape(c, true)), "{lines:?}");
            let json = json_for_terminal(&text);
            prop_assert!(json.chars().all(|c| !needs_escape(c, false)), "{json:?}");
            prop_assert_eq!(serde_json::from_str::<String>(&json).unwrap(), text.clone());
            // Escaping changes exactly the hidden characters.
            let expected: String = text
                .chars()
                .map(|c| if needs_escape(c, false) {
                    let mut one = String::new();
                    push_json_escape(&mut one, c);
                    one
                } else {
                    c.to_string()
                })
                .collect();
            // And a JSON parser reads the escapes back as what they stand for.
            if !text.contains(['"', '\\']) {
                let back: String = serde_json::from_str(&format!("\"{one_line}\"")).unwrap();
                prop_assert_eq!(back, text.clone());
            }
            prop_assert_eq!(one_line.into_owned(), expected);
            prop_assert_eq!(check_visible(&text).is_ok(), text.chars().all(|c| hidden_char(c).is_none()));
        }

        #[test]
        fn escaped_bytes_hold_no_raw_control(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let out = escape_bytes_lines_for_terminal(&bytes);
            prop_assert!(out.chars().all(|c| !needs_escape(c, true)), "{out:?}");
        }
    }
}
