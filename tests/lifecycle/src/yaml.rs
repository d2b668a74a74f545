//! A strict parser for the YAML subset Kubernetes manifests are written in: block mappings
//! and sequences, plain, single- and double-quoted scalars, `|` block scalars, flow
//! sequences of scalars, `{}`, comments and `---` documents. Anything else (anchors, tags,
//! folded scalars, flow mappings, multi-line plain scalars, YAML 1.1's yes/no booleans) is an
//! error rather than a guess, so "it parses here" means "every YAML parser reads it the
//! same way". It saves the workspace a YAML dependency for two test files.
//!
//! Used by tests/deploy/deploy.rs and tests/security/privileges.rs to read deploy/kubernetes/dipam.yaml.

use serde_json::{Map, Value};

pub fn parse(text: &str) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut first = 0;
    for (n, line) in text.lines().enumerate() {
        if line.trim_end() == "---" || line.starts_with("--- #") {
            docs.push((first, std::mem::take(&mut current)));
            first = n + 1;
        } else {
            current.push(line.to_owned());
        }
    }
    docs.push((first, current));
    let mut out = Vec::new();
    for (first, lines) in docs {
        let mut p = Parser {
            lines,
            pos: 0,
            first,
        };
        let Some((indent, _)) = p.peek()? else {
            continue;
        };
        if indent != 0 {
            return Err(p.err("a document must start at column 0"));
        }
        let v = p.block(0)?;
        if p.peek()?.is_some() {
            return Err(p.err("unexpected indentation"));
        }
        out.push(v);
    }
    Ok(out)
}

struct Parser {
    lines: Vec<String>,
    pos: usize,
    /// The document's first line number in the file, for messages.
    first: usize,
}

impl Parser {
    fn err(&self, msg: &str) -> String {
        format!(
            "line {}: {msg}: {:?}",
            self.first + self.pos + 1,
            self.lines.get(self.pos).map_or("", String::as_str)
        )
    }

    /// The next line with content, as (indent, text without its comment); skips blank
    /// and comment lines.
    fn peek(&mut self) -> Result<Option<(usize, String)>, String> {
        while let Some(line) = self.lines.get(self.pos) {
            let body = line.trim_start_matches(' ');
            if body.starts_with('\t') {
                return Err(self.err("tab in indentation"));
            }
            let text = strip_comment(body);
            if text.is_empty() {
                self.pos += 1;
                continue;
            }
            return Ok(Some((line.len() - body.len(), text)));
        }
        Ok(None)
    }

    /// A block node whose first line is at `indent`.
    fn block(&mut self, indent: usize) -> Result<Value, String> {
        match self.peek()? {
            Some((_, t)) if t == "-" || t.starts_with("- ") => self.seq(indent),
            _ => self.map(indent),
        }
    }

    /// The value under `key:` (nothing after the colon), whose parent is at `indent`.
    fn nested(&mut self, indent: usize) -> Result<Value, String> {
        match self.peek()? {
            Some((i, _)) if i > indent => self.block(i),
            // "key:\n- item": a sequence may sit at its key's indentation.
            Some((i, t)) if i == indent && (t == "-" || t.starts_with("- ")) => self.seq(indent),
            _ => Ok(Value::Null),
        }
    }

    fn seq(&mut self, indent: usize) -> Result<Value, String> {
        let mut items = Vec::new();
        while let Some((i, text)) = self.peek()? {
            if i < indent {
                break;
            }
            if i > indent {
                return Err(self.err("unexpected indentation"));
            }
            if !(text == "-" || text.starts_with("- ")) {
                break;
            }
            let rest = text[1..].trim_start().to_owned();
            if rest.is_empty() {
                self.pos += 1;
                items.push(self.nested(indent)?);
            } else if rest.starts_with("- ") || key_split(&rest)?.is_some() {
                // "- key: v": a mapping (or sequence) whose first line is this one, at
                // the column after "- ".
                let col = indent + (text.len() - rest.len());
                self.lines[self.pos] = format!("{}{rest}", " ".repeat(col));
                items.push(self.block(col)?);
            } else {
                let v = self.value(indent, &rest)?;
                items.push(v);
            }
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, indent: usize) -> Result<Value, String> {
        let mut map = Map::new();
        while let Some((i, text)) = self.peek()? {
            if i < indent || (i == indent && (text == "-" || text.starts_with("- "))) {
                break;
            }
            if i > indent {
                return Err(self.err("unexpected indentation"));
            }
            let Some((key, rest)) = key_split(&text)? else {
                return Err(self.err("expected `key: value`"));
            };
            if map.contains_key(&key) {
                return Err(self.err("duplicate key"));
            }
            let v = if rest.is_empty() {
                self.pos += 1;
                self.nested(indent)?
            } else {
                self.value(indent, &rest)?
            };
            map.insert(key, v);
        }
        Ok(Value::Object(map))
    }

    /// The inline value on the current line (consumed), or a block scalar after it.
    fn value(&mut self, indent: usize, text: &str) -> Result<Value, String> {
        self.pos += 1;
        if text == "|" || text == "|-" {
            return self.literal(indent, text == "|-");
        }
        scalar(text).map_err(|e| {
            self.pos -= 1;
            self.err(&e)
        })
    }

    /// A `|` block scalar: every following line indented deeper than `indent` (and the
    /// blank lines among them), with the first line's indentation removed.
    fn literal(&mut self, indent: usize, strip_newline: bool) -> Result<Value, String> {
        let mut lines: Vec<&str> = Vec::new();
        let mut strip = None;
        let mut end = self.pos;
        for line in &self.lines[self.pos..] {
            let body = line.trim_start_matches(' ');
            let col = line.len() - body.len();
            if body.is_empty() {
                lines.push("");
            } else if col > indent && strip.is_none_or(|s| col >= s) {
                let s = *strip.get_or_insert(col);
                lines.push(&line[s..]);
            } else {
                break;
            }
            end += 1;
        }
        // Trailing blank lines are not content ("clip" and "strip" chomping; "|+",
        // which keeps them, is outside the subset).
        while lines.last() == Some(&"") {
            lines.pop();
            end -= 1;
        }
        let mut s = lines.join("\n");
        if !strip_newline && !s.is_empty() {
            s.push('\n');
        }
        self.pos = end;
        Ok(Value::String(s))
    }
}

/// `text` without a trailing comment (`#` after whitespace, outside quotes). A quote
/// opens a quoted scalar only where a token starts, so the apostrophe in a plain
/// `don't` does not hide a comment after it.
fn strip_comment(text: &str) -> String {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut prev = ' ';
    for (i, c) in text.char_indices() {
        match quote {
            Some('"') if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if matches!(c, '"' | '\'') && matches!(prev, ' ' | '[' | ',' | ':') => {
                quote = Some(c);
            }
            None if c == '#' && prev == ' ' => return text[..i].trim_end().to_owned(),
            None => {}
        }
        prev = c;
    }
    text.trim_end().to_owned()
}

/// Splits `key: value` (or `key:`) at the first `:` followed by a space or the end,
/// outside quotes; `None` when the line is not a mapping entry.
fn key_split(text: &str) -> Result<Option<(String, String)>, String> {
    let (key, rest) = if text.starts_with('"') || text.starts_with('\'') {
        let end = quoted_end(text).ok_or("unterminated quoted key")?;
        let after = &text[end..];
        match after.strip_prefix(':') {
            Some(r) if r.is_empty() || r.starts_with(' ') => {
                (scalar(&text[..end])?, r.trim().to_owned())
            }
            _ => return Ok(None),
        }
    } else {
        let Some(i) = text
            .match_indices(':')
            .map(|(i, _)| i)
            .find(|&i| text[i + 1..].is_empty() || text[i + 1..].starts_with(' '))
        else {
            return Ok(None);
        };
        (
            Value::String(text[..i].trim().to_owned()),
            text[i + 1..].trim().to_owned(),
        )
    };
    match key {
        Value::String(k) if !k.is_empty() => Ok(Some((k, rest))),
        _ => Err("keys must be non-empty strings".into()),
    }
}

/// The byte index just past the closing quote of the quoted scalar `text` starts with.
fn quoted_end(text: &str) -> Option<usize> {
    let q = text.chars().next()?;
    let mut chars = text.char_indices().skip(1).peekable();
    while let Some((i, c)) = chars.next() {
        if q == '"' && c == '\\' {
            chars.next();
        } else if c == q {
            if q == '\'' && chars.peek().is_some_and(|&(_, n)| n == '\'') {
                chars.next();
            } else {
                return Some(i + 1);
            }
        }
    }
    None
}

fn scalar(text: &str) -> Result<Value, String> {
    let text = text.trim();
    match text.chars().next() {
        Some('"') => {
            let end = quoted_end(text).ok_or("unterminated double-quoted scalar")?;
            if end != text.len() {
                return Err("text after a quoted scalar".into());
            }
            let mut s = String::new();
            let mut chars = text[1..end - 1].chars();
            while let Some(c) = chars.next() {
                if c != '\\' {
                    s.push(c);
                    continue;
                }
                s.push(match chars.next() {
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some(c @ ('"' | '\\' | '/')) => c,
                    other => return Err(format!("unsupported escape \\{other:?}")),
                });
            }
            Ok(Value::String(s))
        }
        Some('\'') => {
            let end = quoted_end(text).ok_or("unterminated single-quoted scalar")?;
            if end != text.len() {
                return Err("text after a quoted scalar".into());
            }
            Ok(Value::String(text[1..end - 1].replace("''", "'")))
        }
        Some('[') => {
            let inner = text
                .strip_prefix('[')
                .and_then(|t| t.strip_suffix(']'))
                .ok_or("a flow sequence must end on its line")?;
            let mut items = Vec::new();
            let mut rest = inner.trim();
            while !rest.is_empty() {
                let end = if rest.starts_with('"') || rest.starts_with('\'') {
                    quoted_end(rest).ok_or("unterminated quoted item")?
                } else {
                    rest.find(',').unwrap_or(rest.len())
                };
                let item = rest[..end].trim();
                if item.starts_with(['[', '{']) {
                    return Err("nested flow collections are not supported".into());
                }
                items.push(scalar(item)?);
                rest = rest[end..].trim_start();
                rest = match rest.strip_prefix(',') {
                    Some(r) => r.trim_start(),
                    None if rest.is_empty() => rest,
                    None => return Err("expected ',' in a flow sequence".into()),
                };
            }
            Ok(Value::Array(items))
        }
        Some('{') if text == "{}" => Ok(Value::Object(Map::new())),
        Some(c @ ('{' | '&' | '*' | '!' | '>' | '|' | '%' | '@' | '`')) => {
            Err(format!("'{c}' is outside the supported YAML subset"))
        }
        _ => {
            if text.contains(": ") || text.ends_with(':') {
                return Err("a plain scalar cannot contain \": \"; quote it".into());
            }
            // YAML 1.1 (which some Kubernetes tooling follows) reads these as booleans.
            let lower = text.to_ascii_lowercase();
            if ["yes", "no", "on", "off", "y", "n"].contains(&lower.as_str()) {
                return Err(format!("{text:?} is a boolean to YAML 1.1; quote it"));
            }
            Ok(match text {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                "null" | "~" => Value::Null,
                _ => text
                    .parse::<i64>()
                    .map(Value::from)
                    .unwrap_or_else(|_| Value::String(text.to_owned())),
            })
        }
    }
}
