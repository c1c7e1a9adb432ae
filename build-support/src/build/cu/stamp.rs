//! Up-to-date checks: an image is rebuilt only when its command line or one of its inputs changed.
//!
//! Next to each image, a stamp records the exact command lines and, for every input (nvcc, the
//! `.cu` file, each header from nvcc's dependency file, device libraries), its size and
//! modification time. The image is up to date when it exists and a stamp computed now, over the
//! same inputs, is identical to the stored one.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::CuError;

const FIRST_LINE: &str = "build-support .cu stamp, version 1";
const INPUT: &str = "input ";

/// The stamp text for `commands` (nvcc's exact command lines) over `inputs`, as they are now.
fn text(commands: &str, inputs: &[PathBuf]) -> String {
    let mut out = format!("{FIRST_LINE}\n");
    for line in commands.lines() {
        out.push_str(&format!("run {line}\n"));
    }
    for path in inputs {
        let state = match std::fs::metadata(path) {
            Ok(m) => {
                let mtime =
                    m.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
                format!("{} {mtime}", m.len())
            }
            Err(_) => "missing -".to_string(),
        };
        out.push_str(&format!("{INPUT}{state} {}\n", path.display()));
    }
    out
}

/// The inputs recorded in `stamp` when `image` exists and nothing changed since; `None` when it
/// must be rebuilt.
pub(super) fn up_to_date(stamp: &Path, image: &Path, commands: &str) -> Option<Vec<PathBuf>> {
    if !image.is_file() {
        return None;
    }
    let stored = std::fs::read_to_string(stamp).ok()?;
    let inputs: Vec<PathBuf> = stored
        .lines()
        .filter_map(|l| l.strip_prefix(INPUT))
        .map(|rest| rest.splitn(3, ' ').nth(2).map(PathBuf::from))
        .collect::<Option<_>>()?;
    (text(commands, &inputs) == stored).then_some(inputs)
}

/// Forgets the stamp (before a rebuild, so that a failed build is never taken as current).
pub(super) fn remove(stamp: &Path) -> Result<(), CuError> {
    match std::fs::remove_file(stamp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(CuError::Io { action: "cannot remove the stamp", path: stamp.to_path_buf(), error: e })
        }
        _ => Ok(()),
    }
}

/// Records a successful build.
pub(super) fn write(stamp: &Path, commands: &str, inputs: &[PathBuf]) -> Result<(), CuError> {
    std::fs::write(stamp, text(commands, inputs)).map_err(|error| CuError::Io {
        action: "cannot write the stamp",
        path: stamp.to_path_buf(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_to_commands_inputs_or_image_invalidate() {
        let tmp = tempfile::tempdir().unwrap();
        let (stamp, image, header) = (tmp.path().join("k.stamp"), tmp.path().join("k.cubin"), tmp.path().join("k.h"));
        std::fs::write(&header, "a").unwrap();
        let inputs = vec![header.clone()];
        assert_eq!(up_to_date(&stamp, &image, "nvcc k.cu"), None, "no image, no stamp");
        std::fs::write(&image, "elf").unwrap();
        write(&stamp, "nvcc k.cu", &inputs).unwrap();
        assert_eq!(up_to_date(&stamp, &image, "nvcc k.cu"), Some(inputs.clone()));
        assert_eq!(up_to_date(&stamp, &image, "nvcc -G k.cu"), None, "command changed");
        std::fs::write(&header, "ab").unwrap();
        assert_eq!(up_to_date(&stamp, &image, "nvcc k.cu"), None, "input changed");
        write(&stamp, "nvcc k.cu", &inputs).unwrap();
        std::fs::remove_file(&header).unwrap();
        assert_eq!(up_to_date(&stamp, &image, "nvcc k.cu"), None, "input removed");
        remove(&stamp).unwrap();
        remove(&stamp).unwrap();
    }
}
