//! Makes what a refusal leaves behind storable in `lease.rejected_writes`,
//! whatever the refused row held: text there is valid UTF-8 without NUL
//! (every string reaching a record is already UTF-8, converted lossily from
//! the server's bytes, so a `SQL_ASCII` database's invalid bytes arrive as
//! U+FFFD), and `row_data` must be valid jsonb, which is stricter than the
//! json `row_to_json` produces.

use serde_json::{Map, Value};
use std::borrow::Cow;

/// The longest `row_data` document kept; a longer one is stored as
/// `{"truncated": true, "bytes": n}` (never a cut document).
pub const ROW_DATA_MAX: usize = 500;

/// Rows whose data is larger than this are not turned into JSON at all
/// (that could take more memory than the refused row itself, and fail the
/// writer with an out-of-memory error instead of its refusal): their
/// `row_data` is `{"truncated": true, "bytes": <size of the row's data>}`.
pub const ROW_SERIALIZE_MAX: usize = 64 * 1024;

/// What replaces a NUL character, which text and jsonb cannot hold.
const NUL_STANDIN: &str = "\u{FFFD}";

/// `s` without NUL characters.
pub fn without_nul(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', NUL_STANDIN))
    } else {
        Cow::Borrowed(s)
    }
}

/// `s` as a JSON string literal, quotes included; with `ascii`, every
/// character outside ASCII written as a `\u` escape (UTF-16, as JSON
/// spells it), so the literal reads the same in every encoding.
pub fn json_string(s: &str, ascii: bool) -> String {
    let json = serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned());
    if !ascii || json.is_ascii() {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0u16; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// The `row_data` of a row that could not be turned into JSON (a cast to
/// json of one of its columns' types raised an error).
pub const UNSERIALIZABLE: &str = "{\"unserializable\": true}";

/// The marker stored instead of a row too large to keep.
pub fn truncated(bytes: usize) -> String {
    format!("{{\"truncated\": true, \"bytes\": {bytes}}}")
}

/// The `row_data` document for a refused row, from its `row_to_json` text:
/// valid jsonb, at most [`ROW_DATA_MAX`] bytes.
///
/// - NUL characters (`\u0000` in a json value or key) become U+FFFD;
/// - numbers outside what jsonb's numeric comfortably holds become strings
///   holding their text (other numbers keep every digit);
/// - JSON that cannot be taken apart at all (a lone surrogate escape such as
///   `\ud800`, which json accepts and jsonb refuses, or nesting deeper than
///   128 levels) is kept as one JSON string holding the text.
pub fn row_data(row_json: &str) -> String {
    let doc = match serde_json::from_str::<Value>(row_json) {
        Ok(mut value) => {
            make_jsonb_safe(&mut value);
            value
        }
        Err(_) => Value::String(without_nul(row_json).into_owned()),
    };
    let text = doc.to_string();
    if text.len() <= ROW_DATA_MAX {
        text
    } else {
        truncated(row_json.len())
    }
}

fn make_jsonb_safe(value: &mut Value) {
    match value {
        Value::String(s) => {
            if let Cow::Owned(clean) = without_nul(s) {
                *s = clean;
            }
        }
        Value::Number(n) => {
            if !jsonb_holds(n.as_str()) {
                *value = Value::String(n.as_str().to_owned());
            }
        }
        Value::Array(items) => items.iter_mut().for_each(make_jsonb_safe),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains('\0')) {
                let old = std::mem::take(map);
                *map = old.into_iter().map(|(k, v)| (without_nul(&k).into_owned(), v)).collect::<Map<_, _>>();
            }
            map.values_mut().for_each(make_jsonb_safe);
        }
        Value::Null | Value::Bool(_) => {}
    }
}

/// Whether jsonb (numeric: up to 131072 digits before the point and 16383
/// after) surely takes this JSON number, with a wide margin.
fn jsonb_holds(number: &str) -> bool {
    if number.len() > 1000 {
        return false;
    }
    match number.find(['e', 'E']) {
        None => true,
        Some(at) => number[at + 1..].parse::<i64>().is_ok_and(|e| e.abs() <= 1000),
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn nul_characters_become_replacement_characters() {
        assert_eq!(row_data(r#"{"k": "a\u0000b", "\u0000": ["\u0000"]}"#), r#"{"k":"a�b","�":["�"]}"#);
        assert_eq!(without_nul("a\0b"), "a\u{FFFD}b");
        assert!(matches!(without_nul("ab"), Cow::Borrowed("ab")));
    }

    #[pg_test]
    fn numbers_keep_their_digits_unless_jsonb_cannot_hold_them() {
        assert_eq!(
            row_data(r#"{"a": 12345678901234567890.123456789, "b": -0, "c": 1E+5}"#),
            r#"{"a":12345678901234567890.123456789,"b":-0,"c":1e+5}"#
        );
        assert_eq!(
            row_data(r#"[1e1000000, 1e-20000, 1e99999999999999999999]"#),
            r#"["1e+1000000","1e-20000","1e+99999999999999999999"]"#
        );
        let long = "9".repeat(2000);
        assert_eq!(row_data(&format!("[{long}]")), truncated(long.len() + 2));
    }

    #[pg_test]
    fn json_that_cannot_be_parsed_is_kept_as_text() {
        assert_eq!(row_data(r#"{"k": "\ud800"}"#), r#""{\"k\": \"\\ud800\"}""#);
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(row_data(&deep), format!("\"{deep}\""));
    }

    #[pg_test]
    fn long_documents_are_replaced_by_a_marker() {
        let doc = format!(r#"{{"k": "{}"}}"#, "x".repeat(600));
        assert_eq!(row_data(&doc), format!(r#"{{"truncated": true, "bytes": {}}}"#, doc.len()));
        assert_eq!(json_string("a\"b\n\u{1}", false), r#""a\"b\n\u0001""#);
        assert_eq!(json_string("clé 😀", false), "\"clé 😀\"");
        assert_eq!(json_string("clé 😀", true), r#""cl\u00e9 \ud83d\ude00""#);
    }

    #[pg_test]
    fn every_document_is_valid_jsonb() {
        for doc in [
            r#"{"k": "a\u0000b", "\u0000": 1}"#,
            r#"[1e1000000, 1e-20000, "\ud83d\ude00"]"#,
            r#"{"k": "\ud800"}"#,
            r#"{"k": "\udc00\u0000"}"#,
        ] {
            let stored = row_data(doc);
            let ok = Spi::get_one_with_args::<bool>("SELECT $1::jsonb IS NOT NULL", &[stored.clone().into()]);
            assert_eq!(ok, Ok(Some(true)), "{doc} -> {stored}");
        }
    }
}
