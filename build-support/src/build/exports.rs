//! The functions a shared library really exports (its dynamic symbol table).
//!
//! NVSHMEM's headers declare functions that `libnvshmem_host.so.3` does not export (device-only
//! functions, header-inline init variants); binding them would give symbols that cannot load. The
//! export list is the allowlist.

use std::collections::BTreeSet;
use std::path::Path;

use object::{Object, ObjectSymbol, SymbolKind};

/// Names of the defined, global function symbols in `library`'s dynamic symbol table.
pub fn exported_functions(library: &Path) -> Result<BTreeSet<String>, String> {
    let data = std::fs::read(library).map_err(|e| format!("cannot read {}: {e}", library.display()))?;
    let file =
        object::File::parse(&*data).map_err(|e| format!("{} is not a readable object file: {e}", library.display()))?;
    let names = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global() && s.kind() == SymbolKind::Text)
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect::<BTreeSet<_>>();
    if names.is_empty() {
        return Err(format!("{} exports no functions", library.display()));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libc_exports() {
        // Any glibc system has libc.so.6 somewhere standard.
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists())
            .expect("no libc.so.6 found");
        let names = exported_functions(libc).unwrap();
        assert!(names.contains("malloc"));
        assert!(!names.contains("environ"), "data symbols are not functions");
    }

    #[test]
    fn non_object_file_is_an_error() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), b"not an elf").unwrap();
        assert!(exported_functions(tmp.path()).unwrap_err().contains("is not a readable object file"));
    }
}
