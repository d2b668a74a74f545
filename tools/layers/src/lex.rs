//! The tokens of Rust source that name modules.

/// A token, as far as module paths care.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    Ident(String),
    Str(String),
    Path, // `::`
    Punct(char),
    /// A `// Layer NAME: ..` line: the module declarations after it, up to the next such
    /// line, are the layer NAME (the crate's declared order, from the ground up).
    Layer(String),
}

/// Splits Rust source into identifiers, string literals, `::`, single punctuation and layer
/// headers, each with its line; other comments (doc comments too: intra-doc links are not
/// dependencies), char literals, lifetimes and numbers are dropped.
pub(crate) fn lex(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let count_lines = |s: &[char]| s.iter().filter(|&&ch| ch == '\n').count();
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            let start = i;
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
            let comment: String = c[start..i].iter().collect();
            if let Some(name) = layer_header(&comment) {
                out.push((Tok::Layer(name), line));
            }
        } else if ch == '/' && next == Some('*') {
            let (start, mut depth) = (i, 0usize);
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += count_lines(&c[start..i.min(c.len())]);
        } else if ch == '"' || (matches!(ch, 'r' | 'b') && raw_or_byte_string(&c, i)) {
            let start = i;
            let (body, end) = string_literal(&c, i);
            out.push((Tok::Str(body), line));
            line += count_lines(&c[start..end]);
            i = end;
        } else if ch == '\'' {
            // A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // r#ident: the raw prefix is not part of the name.
            if word == "r" && c.get(i) == Some(&'#') {
                i += 1;
                continue;
            }
            out.push((Tok::Ident(word), line));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                // `0..n`: a range, not a fraction.
                if c[i] == '.' && c.get(i + 1) == Some(&'.') {
                    break;
                }
                i += 1;
            }
        } else if ch == ':' && next == Some(':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// `// Layer NAME: what it holds` names the layer NAME; any other comment names none.
fn layer_header(comment: &str) -> Option<String> {
    let rest = comment.strip_prefix("// Layer ")?;
    let (name, _) = rest.split_once(':')?;
    let name = name.trim();
    (!name.is_empty() && !name.contains(' ')).then(|| name.to_owned())
}

/// `r"..."`, `r#"..."#`, `b"..."`, `br#"..."#` start at `i`.
fn raw_or_byte_string(c: &[char], i: usize) -> bool {
    // Only where an identifier would start: `for"` is not a literal.
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return false;
    }
    let mut j = i;
    if c[j] == 'b' {
        j += 1;
    }
    if c.get(j) == Some(&'r') {
        j += 1;
        while c.get(j) == Some(&'#') {
            j += 1;
        }
    }
    j > i && c.get(j) == Some(&'"')
}

/// The body of the string literal starting at `i` and the index after it.
fn string_literal(c: &[char], mut i: usize) -> (String, usize) {
    let mut raw = false;
    if c[i] == 'b' {
        i += 1;
    }
    if c[i] == 'r' {
        raw = true;
        i += 1;
    }
    let mut hashes = 0;
    while c[i] == '#' {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening quote
    let start = i;
    while i < c.len() {
        if !raw && c[i] == '\\' {
            i += 2;
            continue;
        }
        if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
            let body = c[start..i].iter().collect();
            return (body, i + 1 + hashes);
        }
        i += 1;
    }
    (c[start..].iter().collect(), c.len())
}
