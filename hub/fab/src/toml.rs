//! pyproject.toml as Flower holds it: a tree of ordered tables (`tomli.loads` gives Python
//! dicts in document order), and [`dumps`], a port of `tomli_w.dumps` 1.2 (what `flwr build`
//! writes into a FAB), so that our pyproject.toml is byte for byte Flower's. Parsing is
//! `toml_edit`'s (TOML 1.1, like tomli 2.4+).

use std::fmt::Write as _;

use toml_edit::{Datetime, DocumentMut, Item, Offset, Value};

/// A TOML value as tomli returns it (inline tables and tables alike are dicts; arrays of tables
/// are lists of dicts).
#[derive(Clone, Debug, PartialEq)]
pub enum Toml {
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float (`inf`, `nan` included).
    Float(f64),
    /// A string.
    Str(String),
    /// A date, time or date-time.
    Datetime(Datetime),
    /// An array (of anything, tables included).
    Array(Vec<Toml>),
    /// A table, keys in document order.
    Table(Table),
}

/// Key/value pairs in document (Python dict insertion) order.
pub type Table = Vec<(String, Toml)>;

// === impl Toml ===

impl Toml {
    /// The table, if this is one.
    pub fn as_table(&self) -> Option<&Table> {
        match self {
            Toml::Table(t) => Some(t),
            _ => None,
        }
    }

    /// What kind of value this is, for messages ("a string", "an array", …).
    pub fn kind(&self) -> &'static str {
        match self {
            Toml::Bool(_) => "a boolean",
            Toml::Int(_) => "an integer",
            Toml::Float(_) => "a float",
            Toml::Str(_) => "a string",
            Toml::Datetime(_) => "a date/time",
            Toml::Array(_) => "an array",
            Toml::Table(_) => "a table",
        }
    }
}

/// The value under `key` in `table`.
pub fn get<'a>(table: &'a Table, key: &str) -> Option<&'a Toml> {
    table.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Why a TOML document does not parse: the parser's message and where (1-based line and
/// column, in characters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// What is wrong.
    pub message: String,
    /// The line it is on.
    pub line: usize,
    /// The column it is at.
    pub column: usize,
}

// === impl ParseError ===

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.message
        )
    }
}

/// The largest TOML document read (a Flower app's `pyproject.toml` is a few KiB): what a
/// hostile FAB could make the hub parse and hold is bounded by it.
pub const MAX_DOCUMENT: usize = 1 << 20;

/// Parses a TOML document (tomli refuses a byte-order mark; so do we). Documents over
/// [`MAX_DOCUMENT`] bytes and nesting beyond the parser's limit (about 100 levels) are errors.
pub fn parse(text: &str) -> Result<Table, ParseError> {
    if text.len() > MAX_DOCUMENT {
        return Err(ParseError {
            message: format!(
                "the document is {} bytes; a Flower app's pyproject.toml is a few KiB, and at most {MAX_DOCUMENT} bytes (1 MiB) with up to 100 levels of nesting are read",
                text.len()
            ),
            line: 1,
            column: 1,
        });
    }
    if text.starts_with('\u{feff}') {
        return Err(ParseError {
            message: "the text starts with a UTF-8 byte-order mark, which Flower's TOML reader \
                      refuses; save it without one"
                .to_owned(),
            line: 1,
            column: 1,
        });
    }
    // tomli reads "\r\n" as "\n" everywhere, in multiline strings too.
    let text = text.replace("\r\n", "\n");
    let doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
        let at = e.span().map_or(0, |s| s.start).min(text.len());
        let before = text.get(..at).unwrap_or_default();
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let message = e.message().trim_end();
        ParseError {
            message: if message.contains("recursion limit") || message.contains("recursion depth") {
                format!(
                    "{message}: keys, tables or arrays nested too deeply (a Flower app's pyproject.toml nests a few levels)"
                )
            } else {
                message.to_owned()
            },
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    })?;
    Ok(table_of(doc.as_table().iter()))
}

fn table_of<'a>(items: impl Iterator<Item = (&'a str, &'a Item)>) -> Table {
    items
        .filter_map(|(k, item)| from_item(item).map(|v| (k.to_owned(), v)))
        .collect()
}

fn from_item(item: &Item) -> Option<Toml> {
    match item {
        Item::None => None,
        Item::Value(v) => Some(from_value(v)),
        Item::Table(t) => Some(Toml::Table(table_of(t.iter()))),
        Item::ArrayOfTables(a) => Some(Toml::Array(
            a.iter().map(|t| Toml::Table(table_of(t.iter()))).collect(),
        )),
    }
}

fn from_value(v: &Value) -> Toml {
    match v {
        Value::String(s) => Toml::Str(s.value().clone()),
        Value::Integer(i) => Toml::Int(*i.value()),
        Value::Float(f) => Toml::Float(*f.value()),
        Value::Boolean(b) => Toml::Bool(*b.value()),
        Value::Datetime(d) => Toml::Datetime(*d.value()),
        Value::Array(a) => Toml::Array(a.iter().map(from_value).collect()),
        Value::InlineTable(t) => Toml::Table(
            t.iter()
                .map(|(k, v)| (k.to_owned(), from_value(v)))
                .collect(),
        ),
    }
}

// === tomli_w.dumps ===

/// `tomli_w` pads inline arrays with this per nesting level.
const INDENT: &str = "    ";
/// `tomli_w`'s limit for writing an array of tables inline.
const MAX_LINE_LENGTH: usize = 100;

/// `tomli_w.dumps(table)` (defaults: no multiline strings, indent 4).
pub fn dumps(table: &Table) -> String {
    let mut out = String::new();
    table_chunks(table, "", false, &mut out);
    out
}

fn table_chunks(table: &Table, name: &str, inside_aot: bool, out: &mut String) {
    let mut literals: Vec<(&str, &Toml)> = Vec::new();
    let mut tables: Vec<(&str, &Table, bool)> = Vec::new();
    for (k, v) in table {
        match v {
            Toml::Table(t) => tables.push((k, t, false)),
            Toml::Array(items) if is_aot(items) && !items.iter().all(suitable_inline) => {
                tables.extend(
                    items
                        .iter()
                        .filter_map(Toml::as_table)
                        .map(|t| (&**k, t, true)),
                );
            }
            _ => literals.push((k, v)),
        }
    }
    let mut yielded = false;
    if inside_aot || (!name.is_empty() && (!literals.is_empty() || tables.is_empty())) {
        yielded = true;
        if inside_aot {
            let _ = writeln!(out, "[[{name}]]");
        } else {
            let _ = writeln!(out, "[{name}]");
        }
    }
    if !literals.is_empty() {
        yielded = true;
        for (k, v) in literals {
            let _ = writeln!(out, "{} = {}", key_part(k), literal(v, 0));
        }
    }
    for (k, t, in_aot) in tables {
        if yielded {
            out.push('\n');
        } else {
            yielded = true;
        }
        let display = if name.is_empty() {
            key_part(k)
        } else {
            format!("{name}.{}", key_part(k))
        };
        table_chunks(t, &display, in_aot, out);
    }
}

/// A non-empty array whose items are all tables.
fn is_aot(items: &[Toml]) -> bool {
    !items.is_empty() && items.iter().all(|v| matches!(v, Toml::Table(_)))
}

/// `is_suitable_inline_table`: the table fits on one line of at most 100 characters.
fn suitable_inline(item: &Toml) -> bool {
    let Toml::Table(t) = item else { return false };
    let rendered = format!("{INDENT}{},", inline_table(t));
    rendered.chars().count() <= MAX_LINE_LENGTH && !rendered.contains('\n')
}

fn literal(v: &Toml, nest: usize) -> String {
    match v {
        Toml::Bool(b) => if *b { "true" } else { "false" }.to_owned(),
        Toml::Int(i) => i.to_string(),
        Toml::Float(f) => py_float_repr(*f),
        Toml::Datetime(d) => py_datetime_str(d),
        Toml::Str(s) => quote(s),
        Toml::Array(items) => inline_array(items, nest),
        Toml::Table(t) => inline_table(t),
    }
}

fn inline_table(t: &Table) -> String {
    if t.is_empty() {
        return "{}".to_owned();
    }
    let pairs: Vec<String> = t
        .iter()
        .map(|(k, v)| format!("{} = {}", key_part(k), literal(v, 0)))
        .collect();
    format!("{{ {} }}", pairs.join(", "))
}

fn inline_array(items: &[Toml], nest: usize) -> String {
    if items.is_empty() {
        return "[]".to_owned();
    }
    let item_indent = INDENT.repeat(nest + 1);
    let lines: Vec<String> = items
        .iter()
        .map(|v| format!("{item_indent}{}", literal(v, nest + 1)))
        .collect();
    format!("[\n{},\n{}]", lines.join(",\n"), INDENT.repeat(nest))
}

/// A key, bare when it can be.
fn key_part(k: &str) -> String {
    let bare = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if bare { k.to_owned() } else { quote(k) }
}

/// A basic string: `"` and `\` escaped, control characters (but tab) as `\b \n \f \r` or
/// `\u00XX`.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push('\t'),
            c if c < ' ' || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Python's `repr(float)`: the shortest digits that read back, positional for exponents -4..15
/// (with a `.0` when integral), else `1.5e+16` / `1e-05`.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    let decpt = exp + 1;
    let body = if -4 < decpt && decpt <= 16 {
        if decpt <= 0 {
            format!("0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt >= n {
            format!("{digits}{}.0", "0".repeat((decpt - n) as usize))
        } else {
            let (int, frac) = digits.split_at(decpt as usize);
            format!("{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{first}{frac}e{esign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

/// `str()` of the `datetime` / `date` / `time` tomli makes of a TOML date-time (microseconds,
/// a space between date and time, `Z` as `+00:00`).
fn py_datetime_str(d: &Datetime) -> String {
    let mut out = String::new();
    if let Some(date) = d.date {
        let _ = write!(out, "{:04}-{:02}-{:02}", date.year, date.month, date.day);
    }
    if let Some(time) = d.time {
        if d.date.is_some() {
            out.push(' ');
        }
        let _ = write!(
            out,
            "{:02}:{:02}:{:02}",
            time.hour,
            time.minute,
            time.second.unwrap_or(0)
        );
        let micros = time.nanosecond.unwrap_or(0) / 1000;
        if micros != 0 {
            let _ = write!(out, ".{micros:06}");
        }
    }
    match d.offset {
        Some(Offset::Z) => out.push_str("+00:00"),
        Some(Offset::Custom { minutes }) => {
            let sign = if minutes < 0 { '-' } else { '+' };
            let m = minutes.unsigned_abs();
            let _ = write!(out, "{sign}{:02}:{:02}", m / 60, m % 60);
        }
        None => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        // Expected values are CPython 3.11's repr().
        let cases = [
            (0.05, "0.05"),
            (120.0, "120.0"),
            (1e16, "1e+16"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1234567890123456.0, "1234567890123456.0"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (5e-324, "5e-324"),
            (-0.0, "-0.0"),
            (-2.5e300, "-2.5e+300"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x), want, "{x:e}");
        }
    }

    #[test]
    fn tables_keep_document_order_and_dump_like_tomli_w() {
        // Expected text is tomli_w.dumps(tomli.loads(...)) from the flwr 1.42 venv.
        let t = parse("[a.b]\nx=1\n[a]\ny=2\n[c]\n[a.d]\n").unwrap();
        assert_eq!(dumps(&t), "[a]\ny = 2\n\n[a.b]\nx = 1\n\n[a.d]\n\n[c]\n");
    }

    #[test]
    fn datetimes_dump_as_python_str() {
        let t = parse(
            "x=1979-05-27T07:32:00.123456789-08:00\ny=07:32\nz=1979-05-27\nw=1979-05-27 00:00:00Z",
        )
        .unwrap();
        assert_eq!(
            dumps(&t),
            "x = 1979-05-27 07:32:00.123456-08:00\ny = 07:32:00\nz = 1979-05-27\nw = 1979-05-27 00:00:00+00:00\n"
        );
    }

    #[test]
    fn multiline_strings_read_crlf_as_lf() {
        // tomli: 'a = """x\r\ny"""' is "x\ny".
        let t = parse("a = \"\"\"x\r\ny\"\"\"\r\n").unwrap();
        assert_eq!(get(&t, "a"), Some(&Toml::Str("x\ny".to_owned())));
    }
}

#[cfg(test)]
mod hostile {
    use super::*;

    #[test]
    fn deep_or_huge_documents_are_errors_or_bounded_never_a_crash() {
        // Invariant: documents nested 100,000 levels (dotted keys, table headers, inline arrays
        // and tables) and one with a million keys give an error that says what is wrong, or a
        // table, without overflowing the stack of a test thread (2 MiB).
        let deep = 100_000;
        let dotted = format!("{} = 1\n", vec!["k"; deep].join("."));
        let header = format!("[{}]\nx = 1\n", vec!["t"; deep].join("."));
        let arrays = format!("a = {}1{}\n", "[".repeat(deep), "]".repeat(deep));
        let inline = format!("a = {}{}\n", "{b = ".repeat(deep), "}".repeat(deep));
        for (what, text) in [
            ("dotted", dotted),
            ("header", header),
            ("arrays", arrays),
            ("inline", inline),
        ] {
            match parse(&text) {
                Err(e) => assert!(e.to_string().contains("nested too deeply"), "{what}: {e}"),
                Ok(_) => panic!("{what}: a 100,000-deep document was accepted"),
            }
        }
        let many: String = (0..1_000_000).map(|i| format!("k{i} = 1\n")).collect();
        match parse(&many) {
            Err(e) => assert!(e.to_string().contains("at most 1048576 bytes"), "{e}"),
            Ok(_) => panic!("a million keys were accepted"),
        }
    }
}
