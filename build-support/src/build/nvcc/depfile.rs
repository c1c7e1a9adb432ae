//! The make-style dependency files nvcc writes with `-MD -MF <file>`.
//!
//! ```text
//! /out/scale.cubin : /src/scale.cu \
//!     /usr/include/stdc-predef.h \
//!     /src/my\ header.h
//! ```
//!
//! Lines ending in `\` continue; `\ ` is a space inside a name, `$$` a dollar sign. Every rule's
//! prerequisites are returned, first-seen order, without duplicates.

use std::path::{Path, PathBuf};

/// The prerequisites listed in `text`. Relative names are taken relative to `cwd` (the directory
/// nvcc ran in).
pub fn parse(text: &str, cwd: &Path) -> Vec<PathBuf> {
    let joined = text.replace("\\\r\n", " ").replace("\\\n", " ");
    let mut out: Vec<PathBuf> = Vec::new();
    for rule in joined.lines() {
        let words = words(rule);
        let Some(colon) = words.iter().position(|w| w.ends_with(':')) else { continue };
        for word in &words[colon + 1..] {
            let path = cwd.join(word);
            if !out.contains(&path) {
                out.push(path);
            }
        }
    }
    out
}

/// Splits at unescaped blanks; `\ ` and `\#` keep the character, `$$` is `$`. A lone `:` word is
/// kept as its own word so that `target : deps` and `target: deps` read alike.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if matches!(chars.peek(), Some(' ' | '\t' | '#')) => word.extend(chars.next()),
            '$' if chars.peek() == Some(&'$') => {
                chars.next();
                word.push('$');
            }
            ' ' | '\t' => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            _ => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_escapes_relative_names_and_duplicates() {
        let text = "/out/k.cubin : /src/k.cu \\\n    local.h \\\n    /src/my\\ dir/a$$b.h \\\n    local.h\n";
        assert_eq!(
            parse(text, Path::new("/cwd")),
            [PathBuf::from("/src/k.cu"), PathBuf::from("/cwd/local.h"), PathBuf::from("/src/my dir/a$b.h"),]
        );
    }

    #[test]
    fn target_glued_to_the_colon_and_phony_rules() {
        let text = "k.o: k.cu a.h\na.h:\n";
        assert_eq!(parse(text, Path::new("/d")), [PathBuf::from("/d/k.cu"), PathBuf::from("/d/a.h")]);
    }
}
