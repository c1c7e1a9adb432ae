//! What a CUDA module image was built for, read from its header before it is loaded, so that a
//! cubin built for another GPU is refused with a message naming both architectures (the driver
//! would only say `CUDA_ERROR_NO_BINARY_FOR_GPU`). Used at run time by the safe crates.

use std::fmt;

/// The kind of a module image and the architectures it holds code for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageKind {
    /// An ELF cubin with machine code for exactly one `sm_XX` (e.g. `90`).
    Cubin {
        /// The compute capability as `major * 10 + minor`.
        sm: u32,
    },
    /// A fat binary (several architectures and/or PTX); the driver picks one at load time.
    Fatbin,
    /// PTX text, compiled by the driver at load time.
    Ptx,
}

/// The image is not a cubin, fat binary or PTX.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnImage;

impl fmt::Display for NotAnImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a CUDA module image (neither an ELF cubin, a fat binary nor PTX)")
    }
}

impl std::error::Error for NotAnImage {}

const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// `EI_OSABI` of cubins in the CUDA ≥ 12.8 ELF layout (the SM moved to bits 8..16 of `e_flags`).
const OSABI_CUDA_V2: u8 = 0x41;

/// Reads the kind of `image` from its first bytes.
pub fn image_kind(image: &[u8]) -> Result<ImageKind, NotAnImage> {
    if image.starts_with(b"\x7fELF") {
        // ELF64 little-endian: e_flags is the u32 at offset 48.
        let flags = image.get(48..52).ok_or(NotAnImage)?;
        let flags = u32::from_le_bytes([flags[0], flags[1], flags[2], flags[3]]);
        let sm = if image.get(7) == Some(&OSABI_CUDA_V2) { (flags >> 8) & 0xff } else { flags & 0xff };
        return Ok(ImageKind::Cubin { sm });
    }
    if image.len() >= 4 && u32::from_le_bytes([image[0], image[1], image[2], image[3]]) == FATBIN_MAGIC {
        return Ok(ImageKind::Fatbin);
    }
    let text = &image[..image.len().min(4096)];
    if text.windows(8).any(|w| w == b".version") || text.windows(7).any(|w| w == b".target") {
        return Ok(ImageKind::Ptx);
    }
    Err(NotAnImage)
}

/// The architecture a cubin was built for (`90` for sm_90), or `None` for any other image (fat
/// binaries, PTX, or bytes that are no module at all).
pub fn cubin_arch(image: &[u8]) -> Option<u32> {
    match image_kind(image) {
        Ok(ImageKind::Cubin { sm }) => Some(sm),
        _ => None,
    }
}

/// Whether machine code for `module` runs on a device of `device` (both as `major * 10 + minor`):
/// the same major architecture, with a minor version no newer than the device's.
pub fn runs_on(module: u32, device: u32) -> bool {
    module / 10 == device / 10 && module % 10 <= device % 10
}

/// Checks that `image` can run on a device of compute capability `major.minor`: a cubin must have
/// been built for that major architecture and a minor no newer than the device's ([`runs_on`]);
/// fat binaries and PTX are left to the driver. The error text names both architectures and the
/// variable that chooses them at build time.
pub fn check_arch(image: &[u8], major: u32, minor: u32) -> Result<ImageKind, String> {
    let kind = image_kind(image).map_err(|e| e.to_string())?;
    if let ImageKind::Cubin { sm } = kind {
        let device = major * 10 + minor;
        if !runs_on(sm, device) {
            return Err(format!(
                "the kernel image was built for sm_{sm} but this GPU is sm_{device}; rebuild with CUDA_ARCHS={device} \
                 (or a list that includes it)"
            ));
        }
    }
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(osabi: u8, flags: u32) -> Vec<u8> {
        let mut v = vec![0u8; 64];
        v[..4].copy_from_slice(b"\x7fELF");
        v[7] = osabi;
        v[48..52].copy_from_slice(&flags.to_le_bytes());
        v
    }

    #[test]
    fn reads_the_sm_of_both_elf_layouts() {
        // Flags seen from nvcc 13.0: sm_90 → 0x6005a04, sm_80 → 0x6005004, sm_100 → 0x6006402.
        assert_eq!(image_kind(&elf(0x41, 0x0600_5a04)), Ok(ImageKind::Cubin { sm: 90 }));
        assert_eq!(image_kind(&elf(0x41, 0x0600_5004)), Ok(ImageKind::Cubin { sm: 80 }));
        assert_eq!(image_kind(&elf(0x41, 0x0600_6402)), Ok(ImageKind::Cubin { sm: 100 }));
        assert_eq!(image_kind(&elf(0x33, 0x0050_0550)), Ok(ImageKind::Cubin { sm: 80 }));
        assert_eq!(image_kind(&FATBIN_MAGIC.to_le_bytes()), Ok(ImageKind::Fatbin));
        assert_eq!(image_kind(b"//\n.version 8.0\n.target sm_90\n"), Ok(ImageKind::Ptx));
        assert_eq!(image_kind(b"hello"), Err(NotAnImage));
    }

    #[test]
    fn a_cubin_for_another_gpu_is_refused_by_name() {
        let err = check_arch(&elf(0x41, 0x0600_5004), 9, 0).unwrap_err();
        assert_eq!(
            err,
            "the kernel image was built for sm_80 but this GPU is sm_90; rebuild with CUDA_ARCHS=90 (or a list that includes it)"
        );
        assert!(check_arch(&elf(0x41, 0x0600_5a04), 9, 0).is_ok());
        assert!(check_arch(&FATBIN_MAGIC.to_le_bytes(), 9, 0).is_ok());
        assert!(check_arch(&elf(0x41, 0x0600_5004), 8, 6).is_ok(), "sm_80 code runs on sm_86");
        assert!(check_arch(&elf(0x41, 0x0600_5a04), 8, 6).is_err());
    }

    #[test]
    fn machine_code_runs_on_the_same_major_with_an_equal_or_newer_minor() {
        assert!(runs_on(90, 90));
        assert!(runs_on(80, 86));
        assert!(!runs_on(86, 80));
        assert!(!runs_on(80, 90));
        assert_eq!(cubin_arch(&elf(0x41, 0x0600_6402)), Some(100));
        assert_eq!(cubin_arch(b"//\n.version 8.0\n.target sm_90\n"), None);
        assert_eq!(cubin_arch(&elf(0x41, 0)[..40]), None);
    }
}
