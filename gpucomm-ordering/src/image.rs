//! CUDA module images (cubins, fat binaries, PTX) checked before the driver reads them.
//!
//! `cuModuleLoadData` takes a pointer and no length: the driver finds the end of an image from
//! the image itself — the tables and sections an ELF cubin's headers point at, the sizes a fat
//! binary's header and entries declare, the NUL that ends PTX text. A truncated or corrupt image
//! (or PTX without its NUL) handed over from a byte slice makes the driver read past the slice.
//! [`ModuleImage::new`] refuses such an image, so that the `nccl` and `nvshmem` crates can load
//! any `&[u8]` from safe code:
//!
//! * an **ELF cubin** (ELF64, little-endian) only when its header, its program and section header
//!   tables, every segment and every section with contents (all but `SHT_NOBITS`) lie within the
//!   bytes (checked arithmetic); its program and section headers are exactly 56 and 64 bytes apart
//!   (`e_phentsize`, `e_shentsize`, when there are any); it has a section name table
//!   (`0 < e_shstrndx < e_shnum`); its string tables end with a NUL and the section and symbol names
//!   lie inside their string tables; every symbol's `st_shndx` is a section's index or `SHN_UNDEF`,
//!   `SHN_ABS` or `SHN_COMMON`; and every `SHT_REL`/`SHT_RELA` section has 16/24-byte entries, an
//!   `sh_link` naming an `SHT_SYMTAB` section and an `sh_info` naming a section, and each of its
//!   relocations names a symbol of that table and an `r_offset` below the target section's size;
//! * a **fat binary** (`0xBA55ED50`, the `nvcc -fatbin` layout: a header of exactly 16 bytes
//!   `{magic, version 1, header size 16, size of the entries}`, then entries of a header that
//!   declares its own size (at least 64 bytes) and its payload's) only when its header and every
//!   entry lie within the bytes, and the entries end where the header says; every entry is PTX
//!   (kind 1), whose payload must hold a NUL, or ELF (kind 2), whose payload must be a cubin that
//!   passes the checks above; an entry whose flags (the 64-bit word at byte 40 of its header) have
//!   the compression bit `0x2000` is refused ([`ImageError::CompressedEntry`]);
//! * **PTX** only as UTF-8 text with no NUL before its end (it may end with one); the copy the
//!   driver reads is NUL-terminated.
//!
//! Anything else is refused (PTX is recognised by its `.version` or `.target` directive in the
//! first 4 KiB, as [`build_support::cubin`] does). What the checks do not reach is the
//! inside of the contents: a relocation's type, width and addend (only its offset's start is
//! bounded), a cubin's attributes and NVIDIA-specific sections (`SHT_LOPROC` and above), the PTX
//! of a fat-binary entry beyond its NUL, and the other fields of a fat-binary entry's header (its
//! name offset and length, architecture, the bytes past its first 64). The images `nvcc` writes
//! pass (uncompressed: `--compress-mode=none`, no `-Xfatbin -compress-all`); their architecture is read by
//! [`build_support::cubin`].

use std::ffi::c_void;
use std::fmt;

use build_support::cubin::image_kind;
pub use build_support::cubin::ImageKind;

/// `\x7fELF`.
const ELF_MAGIC: &[u8] = b"\x7fELF";
/// The first word of a fat binary (`FATBIN_MAGIC`).
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// `EI_CLASS` of a 64-bit ELF file (`ELFCLASS64`).
const ELF_CLASS_64: u8 = 2;
/// `EI_DATA` of a little-endian ELF file (`ELFDATA2LSB`).
const ELF_LITTLE_ENDIAN: u8 = 1;
/// Bytes of an ELF64 file header, program header and section header.
const ELF_HEADER: u64 = 64;
const PROGRAM_HEADER: u64 = 56;
const SECTION_HEADER: u64 = 64;
/// Bytes of an ELF64 symbol (`Elf64_Sym`).
const SYMBOL: u64 = 24;
/// `e_phnum` when the real count is elsewhere (`PN_XNUM`); `e_shstrndx` likewise (`SHN_XINDEX`).
const PN_XNUM: u16 = 0xffff;
const SHN_XINDEX: u16 = 0xffff;
/// Section types: symbols, strings, relocations with addends, no contents in the file,
/// relocations, dynamic symbols.
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_RELA: u32 = 4;
const SHT_NOBITS: u32 = 8;
const SHT_REL: u32 = 9;
const SHT_DYNSYM: u32 = 11;
/// Bytes of an ELF64 relocation without and with an addend (`Elf64_Rel`, `Elf64_Rela`).
const REL: u64 = 16;
const RELA: u64 = 24;
/// The reserved `st_shndx` values a symbol may have besides a section's index: undefined,
/// absolute, common.
const SHN_UNDEF: u16 = 0;
const SHN_ABS: u16 = 0xfff1;
const SHN_COMMON: u16 = 0xfff2;
/// Bytes of a fat binary's header, and the smallest header of one of its entries.
const FATBIN_HEADER: u64 = 16;
const FATBIN_ENTRY_HEADER: u64 = 64;
/// A fat binary's `version`.
const FATBIN_VERSION: u16 = 1;
/// An entry's `kind` for PTX text and for ELF code.
const FATBIN_PTX: u16 = 1;
const FATBIN_ELF: u16 = 2;
/// Where an entry's flags are (a 64-bit word), and the flag of a compressed payload
/// (`FATBIN_FLAG_COMPRESS`; nvcc's uncompressed entries have flags 0x11 or 0x1000011).
const FATBIN_ENTRY_FLAGS: usize = 40;
const FATBIN_FLAG_COMPRESS: u64 = 0x2000;

/// Why a module image was refused before the driver saw it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// Neither an ELF cubin, a fat binary nor PTX text.
    #[error("not a CUDA module image (neither an ELF cubin, a fat binary nor PTX text)")]
    NotAnImage,
    /// A part of the image that its headers point at lies (partly) past its end: the image was
    /// truncated or is corrupt, and the driver, which takes no length, would read past it.
    #[error(
        "the image is truncated or corrupt: its {what} ({size} bytes at byte {offset}) runs past its end at byte \
         {end}, where the driver would go on reading"
    )]
    PastEnd {
        /// Which part (`"section header table"`, `"fat binary entry payload"`, …).
        what: &'static str,
        /// Where the image says it starts.
        offset: u64,
        /// How long the image says it is.
        size: u64,
        /// Where the bytes end (for a fat binary's entries, where the header says they end).
        end: u64,
    },
    /// The image's structure is not one the checks (and the driver) know, or is inconsistent.
    #[error("malformed {format}: {reason}")]
    Malformed {
        /// `"ELF cubin"` or `"fat binary"`.
        format: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A cubin inside a fat binary's entry is refused (offsets inside it count from its start).
    #[error("the cubin in the fat binary's entry at byte {entry}: {cubin}")]
    InFatBinary {
        /// Where the entry starts.
        entry: u64,
        /// Why its cubin was refused.
        cubin: Box<ImageError>,
    },
    /// A fat binary entry whose payload is compressed: the driver would decompress it into a
    /// buffer of its own, sized by fields the checks cannot verify.
    #[error(
        "the fat binary's entry at byte {entry} is compressed: compressed fat binary entries are not accepted: the \
         driver would decompress sizes the checks cannot verify; build it uncompressed (nvcc \
         --compress-mode=none from CUDA 12.4 on, and without -Xfatbin -compress-all), or load a cubin (nvcc -cubin)"
    )]
    CompressedEntry {
        /// Where the entry starts.
        entry: u64,
    },
    /// PTX with a NUL byte before its end: the driver would read the text before it only.
    #[error("the PTX text has a NUL byte at byte {at}, before its end")]
    PtxNul {
        /// Where the NUL is.
        at: usize,
    },
    /// PTX that is not UTF-8 text (a binary format the checks do not know, say).
    #[error("the PTX text is not UTF-8 from byte {at} on")]
    PtxNotText {
        /// Where the text stops being UTF-8.
        at: usize,
    },
}

/// A module image checked as described in the [module docs](self), copied so that the driver
/// reads it to its end and no further: what `cuModuleLoadData` may be given.
#[doc(alias = "cuModuleLoadData")]
pub struct ModuleImage {
    kind: ImageKind,
    /// The image, NUL-terminated when it is PTX.
    bytes: Vec<u8>,
}

impl fmt::Debug for ModuleImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModuleImage").field("kind", &self.kind).field("bytes", &self.bytes.len()).finish()
    }
}

impl ModuleImage {
    /// Checks `image` and copies it (with a NUL after PTX text that has none), or says why it
    /// cannot be given to the driver.
    pub fn new(image: &[u8]) -> Result<Self, ImageError> {
        if image.starts_with(ELF_MAGIC) {
            check_elf(image)?;
        } else if image.starts_with(&FATBIN_MAGIC.to_le_bytes()) {
            check_fatbin(image)?;
        }
        // Classified like `build_support::cubin` does for the architecture checks: an
        // ELF or fat-binary magic is checked above, anything else must look like PTX.
        let kind = image_kind(image).map_err(|_| ImageError::NotAnImage)?;
        let ptx = kind == ImageKind::Ptx;
        if ptx {
            check_ptx(image)?;
        }
        let mut bytes = image.to_vec();
        if ptx && bytes.last() != Some(&0) {
            bytes.push(0);
        }
        Ok(ModuleImage { kind, bytes })
    }

    /// What the image is, and for a cubin the architecture it was built for.
    pub fn kind(&self) -> &ImageKind {
        &self.kind
    }

    /// The image for `cuModuleLoadData`: valid while `self` lives.
    pub fn as_ptr(&self) -> *const c_void {
        self.bytes.as_ptr().cast()
    }

    /// The image's bytes (NUL-terminated PTX), e.g. for cudarc's `Ptx::from_binary`.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// The `size` bytes of `bytes` from `offset`, or [`ImageError::PastEnd`] naming `what`.
fn region<'a>(bytes: &'a [u8], what: &'static str, offset: u64, size: u64) -> Result<&'a [u8], ImageError> {
    let past = || ImageError::PastEnd { what, offset, size, end: bytes.len() as u64 };
    let start = usize::try_from(offset).map_err(|_| past())?;
    let len = usize::try_from(size).map_err(|_| past())?;
    let end = start.checked_add(len).ok_or_else(past)?;
    bytes.get(start..end).ok_or_else(past)
}

/// The little-endian integers at `at` of a slice that [`region`] returned at least that long.
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | (u64::from(u32_at(b, at + 4)) << 32)
}

fn malformed_elf(reason: &'static str) -> ImageError {
    ImageError::Malformed { format: "ELF cubin", reason }
}

/// One section header's fields that the checks use.
struct Section {
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    entsize: u64,
}

/// Checks an ELF64 cubin (see the module docs).
fn check_elf(image: &[u8]) -> Result<(), ImageError> {
    let header = region(image, "ELF header", 0, ELF_HEADER)?;
    if header[4] != ELF_CLASS_64 {
        return Err(malformed_elf("not a 64-bit ELF file"));
    }
    if header[5] != ELF_LITTLE_ENDIAN {
        return Err(malformed_elf("not a little-endian ELF file"));
    }
    let (phoff, shoff) = (u64_at(header, 32), u64_at(header, 40));
    let (phentsize, phnum) = (u16_at(header, 54), u16_at(header, 56));
    let (shentsize, shnum, shstrndx) = (u16_at(header, 58), u16_at(header, 60), u16_at(header, 62));

    if phnum == PN_XNUM {
        return Err(malformed_elf("extended program header numbering (e_phnum = PN_XNUM)"));
    }
    if phnum > 0 {
        // Exactly the ELF64 size: a reader that assumes it would see other headers than a stride.
        if u64::from(phentsize) < PROGRAM_HEADER {
            return Err(malformed_elf("program headers smaller than 56 bytes"));
        }
        if u64::from(phentsize) > PROGRAM_HEADER {
            return Err(malformed_elf("program headers larger than 56 bytes"));
        }
        let table = region(image, "program header table", phoff, u64::from(phentsize) * u64::from(phnum))?;
        for entry in table.chunks_exact(usize::from(phentsize)) {
            let (offset, size) = (u64_at(entry, 8), u64_at(entry, 32));
            if size > 0 {
                region(image, "segment", offset, size)?;
            }
        }
    }

    if shnum == 0 {
        if shoff != 0 {
            return Err(malformed_elf("extended section numbering (e_shnum = 0 with a section header table)"));
        }
        return Ok(());
    }
    if u64::from(shentsize) < SECTION_HEADER {
        return Err(malformed_elf("section headers smaller than 64 bytes"));
    }
    if u64::from(shentsize) > SECTION_HEADER {
        return Err(malformed_elf("section headers larger than 64 bytes"));
    }
    // Before anything is read through it, so that the section names are always checked.
    if shstrndx == SHN_XINDEX {
        return Err(malformed_elf("extended section numbering (e_shstrndx = SHN_XINDEX)"));
    }
    if shstrndx == 0 {
        return Err(malformed_elf("no section name table (e_shstrndx = 0)"));
    }
    if shstrndx >= shnum {
        return Err(malformed_elf("the section name table index (e_shstrndx) is not below e_shnum"));
    }
    let table = region(image, "section header table", shoff, u64::from(shentsize) * u64::from(shnum))?;
    let sections: Vec<Section> = table
        .chunks_exact(usize::from(shentsize))
        .map(|s| Section {
            name: u32_at(s, 0),
            kind: u32_at(s, 4),
            offset: u64_at(s, 24),
            size: u64_at(s, 32),
            link: u32_at(s, 40),
            info: u32_at(s, 44),
            entsize: u64_at(s, 56),
        })
        .collect();
    // Every section with contents, and what the driver reads as C strings in it.
    let mut contents = Vec::with_capacity(sections.len());
    for s in &sections {
        let bytes =
            if s.kind == SHT_NOBITS || s.size == 0 { &[][..] } else { region(image, "section", s.offset, s.size)? };
        if s.kind == SHT_STRTAB && bytes.last().is_some_and(|&b| b != 0) {
            return Err(malformed_elf("a string table does not end with a NUL byte"));
        }
        contents.push(bytes);
    }
    let strings = |index: usize| match sections.get(index) {
        Some(s) if s.kind == SHT_STRTAB => Ok(contents[index]),
        _ => Err(malformed_elf("a name table index does not name a string table")),
    };
    // Section names.
    let names = strings(usize::from(shstrndx))?;
    if sections.iter().any(|s| s.name as usize >= names.len()) {
        return Err(malformed_elf("a section name lies outside the section name table"));
    }
    // Symbol names and sections.
    for (s, symbols) in sections.iter().zip(&contents) {
        if s.kind != SHT_SYMTAB && s.kind != SHT_DYNSYM {
            continue;
        }
        if s.entsize != SYMBOL {
            return Err(malformed_elf("a symbol table's entries are not 24 bytes"));
        }
        let names = strings(s.link as usize)?;
        for symbol in symbols.chunks_exact(SYMBOL as usize) {
            if u32_at(symbol, 0) as usize >= names.len() {
                return Err(malformed_elf("a symbol name lies outside its string table"));
            }
            let section = u16_at(symbol, 6);
            if section >= shnum && !matches!(section, SHN_UNDEF | SHN_ABS | SHN_COMMON) {
                return Err(malformed_elf(
                    "a symbol's section index (st_shndx) is neither a section nor SHN_UNDEF, SHN_ABS or SHN_COMMON",
                ));
            }
        }
    }
    // Relocations: their symbols and the places they patch.
    for (s, relocations) in sections.iter().zip(&contents) {
        let entry = match s.kind {
            SHT_REL => REL,
            SHT_RELA => RELA,
            _ => continue,
        };
        if s.entsize != entry {
            return Err(malformed_elf("a relocation section's entries are not 16 (SHT_REL) or 24 (SHT_RELA) bytes"));
        }
        let symbols = match sections.get(s.link as usize) {
            Some(t) if t.kind == SHT_SYMTAB => contents[s.link as usize].len() as u64 / SYMBOL,
            _ => return Err(malformed_elf("a relocation section's sh_link does not name a symbol table")),
        };
        let Some(target) = sections.get(s.info as usize) else {
            return Err(malformed_elf("a relocation section's target (sh_info) is not a section"));
        };
        for relocation in relocations.chunks_exact(entry as usize) {
            if u64_at(relocation, 8) >> 32 >= symbols {
                return Err(malformed_elf("a relocation's symbol index lies past its symbol table"));
            }
            if u64_at(relocation, 0) >= target.size {
                return Err(malformed_elf("a relocation's offset lies outside its target section"));
            }
        }
    }
    Ok(())
}

/// Checks a fat binary (see the module docs).
fn check_fatbin(image: &[u8]) -> Result<(), ImageError> {
    let malformed = |reason| ImageError::Malformed { format: "fat binary", reason };
    let header = region(image, "fat binary header", 0, FATBIN_HEADER)?;
    let (version, header_size, fat_size) = (u16_at(header, 4), u16_at(header, 6), u64_at(header, 8));
    if version != FATBIN_VERSION {
        return Err(malformed("unknown version (not 1)"));
    }
    // Exactly the header's size: a reader that assumes it would parse other entries.
    if u64::from(header_size) != FATBIN_HEADER {
        return Err(malformed("a header size other than 16 bytes"));
    }
    // The entries run from the header's end to where it says; none may cross that end.
    let entries_end = u64::from(header_size).checked_add(fat_size);
    let entries = entries_end.and_then(|end| image.get(..usize::try_from(end).ok()?)).ok_or(ImageError::PastEnd {
        what: "fat binary entries",
        offset: u64::from(header_size),
        size: fat_size,
        end: image.len() as u64,
    })?;
    let mut at = u64::from(header_size);
    while at < entries.len() as u64 {
        let head = region(entries, "fat binary entry header", at, FATBIN_ENTRY_HEADER)?;
        let (kind, head_size, payload_size) = (u16_at(head, 0), u32_at(head, 4), u64_at(head, 8));
        if u64::from(head_size) < FATBIN_ENTRY_HEADER {
            return Err(malformed("an entry header smaller than 64 bytes"));
        }
        region(entries, "fat binary entry header", at, u64::from(head_size))?;
        // Both within `entries` (a slice), so no overflow.
        let payload_at = at + u64::from(head_size);
        let payload = region(entries, "fat binary entry payload", payload_at, payload_size)?;
        if u64_at(head, FATBIN_ENTRY_FLAGS) & FATBIN_FLAG_COMPRESS != 0 {
            return Err(ImageError::CompressedEntry { entry: at });
        }
        match kind {
            // The driver reads PTX as a C string: nvcc pads it with NULs.
            FATBIN_PTX if !payload.contains(&0) => {
                return Err(malformed("a PTX entry without a NUL byte in its payload"));
            }
            FATBIN_PTX => {}
            FATBIN_ELF if !payload.starts_with(ELF_MAGIC) => {
                return Err(malformed("an ELF entry whose payload is not an ELF file"));
            }
            FATBIN_ELF => {
                check_elf(payload).map_err(|e| ImageError::InFatBinary { entry: at, cubin: Box::new(e) })?;
            }
            _ => return Err(malformed("an entry of an unknown kind (neither 1, PTX, nor 2, ELF)")),
        }
        at = payload_at + payload_size;
    }
    Ok(())
}

/// Checks PTX text: UTF-8, no NUL but a last byte.
fn check_ptx(image: &[u8]) -> Result<(), ImageError> {
    let text = image.strip_suffix(&[0]).unwrap_or(image);
    if let Some(at) = text.iter().position(|&b| b == 0) {
        return Err(ImageError::PtxNul { at });
    }
    std::str::from_utf8(text).map_err(|e| ImageError::PtxNotText { at: e.valid_up_to() })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `e_flags` of an sm_90 cubin in the CUDA ≥ 12.8 layout (with `EI_OSABI` 0x41), as nvcc 13.0
    /// writes it.
    const SM_90_FLAGS: u32 = 0x0600_5a04;

    fn put(image: &mut [u8], at: usize, bytes: &[u8]) {
        image[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// Offsets into [`elf`]'s image, for the tests to corrupt.
    struct Elf {
        image: Vec<u8>,
        /// The program header table (one segment) and the section header table (5 sections:
        /// none, `.shstrtab`, `.text`, `.strtab`, `.symtab`).
        phoff: usize,
        shoff: usize,
    }

    impl Elf {
        /// Where field `at` of section `index`'s header is.
        fn section(&self, index: usize, at: usize) -> usize {
            self.shoff + index * SECTION_HEADER as usize + at
        }
    }

    const NAMES: &[u8] = b"\0.shstrtab\0.text\0.strtab\0.symtab\0";
    const STRINGS: &[u8] = b"\0kernel\0";

    /// A minimal sm_90 cubin: header, one segment over `.text`, names, one symbol.
    fn elf() -> Elf {
        let text = [0xAAu8; 16];
        let mut symbols = vec![0u8; 2 * SYMBOL as usize];
        symbols[24..28].copy_from_slice(&1u32.to_le_bytes()); // "kernel"
        let phoff = ELF_HEADER as usize;
        let names_at = phoff + PROGRAM_HEADER as usize;
        let text_at = names_at + NAMES.len();
        let strings_at = text_at + text.len();
        let symbols_at = strings_at + STRINGS.len();
        let shoff = (symbols_at + symbols.len()).next_multiple_of(8);
        let mut image = vec![0u8; shoff + 5 * SECTION_HEADER as usize];
        put(&mut image, 0, b"\x7fELF\x02\x01\x01\x41");
        put(&mut image, 18, &190u16.to_le_bytes()); // EM_CUDA
        put(&mut image, 32, &(phoff as u64).to_le_bytes());
        put(&mut image, 40, &(shoff as u64).to_le_bytes());
        put(&mut image, 48, &SM_90_FLAGS.to_le_bytes());
        for (at, v) in [(52, 64u16), (54, 56), (56, 1), (58, 64), (60, 5), (62, 1)] {
            put(&mut image, at, &v.to_le_bytes());
        }
        put(&mut image, phoff, &1u32.to_le_bytes()); // PT_LOAD
        put(&mut image, phoff + 8, &(text_at as u64).to_le_bytes());
        put(&mut image, phoff + 32, &(text.len() as u64).to_le_bytes());
        put(&mut image, names_at, NAMES);
        put(&mut image, text_at, &text);
        put(&mut image, strings_at, STRINGS);
        put(&mut image, symbols_at, &symbols);
        let headers: [(u32, u32, usize, usize, u32); 4] = [
            (1, SHT_STRTAB, names_at, NAMES.len(), 0),
            (11, 1, text_at, text.len(), 0), // SHT_PROGBITS
            (17, SHT_STRTAB, strings_at, STRINGS.len(), 0),
            (25, SHT_SYMTAB, symbols_at, symbols.len(), 3),
        ];
        let mut elf = Elf { image, phoff, shoff };
        for (i, (name, kind, offset, size, link)) in headers.into_iter().enumerate() {
            let at = elf.section(i + 1, 0);
            put(&mut elf.image, at, &name.to_le_bytes());
            put(&mut elf.image, at + 4, &kind.to_le_bytes());
            put(&mut elf.image, at + 24, &(offset as u64).to_le_bytes());
            put(&mut elf.image, at + 32, &(size as u64).to_le_bytes());
            put(&mut elf.image, at + 40, &link.to_le_bytes());
            let entsize = if kind == SHT_SYMTAB { SYMBOL } else { 0 };
            put(&mut elf.image, at + 56, &entsize.to_le_bytes());
        }
        elf
    }

    /// A fat binary of `entries` (kind, payload), each with a 64-byte header.
    fn fatbin(entries: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (kind, payload) in entries {
            let mut head = [0u8; 64];
            put(&mut head, 0, &kind.to_le_bytes());
            put(&mut head, 2, &0x0101u16.to_le_bytes());
            put(&mut head, 4, &64u32.to_le_bytes());
            put(&mut head, 8, &(payload.len() as u64).to_le_bytes());
            body.extend_from_slice(&head);
            body.extend_from_slice(payload);
        }
        let mut image = FATBIN_MAGIC.to_le_bytes().to_vec();
        image.extend_from_slice(&FATBIN_VERSION.to_le_bytes());
        image.extend_from_slice(&16u16.to_le_bytes());
        image.extend_from_slice(&(body.len() as u64).to_le_bytes());
        image.extend_from_slice(&body);
        image
    }

    fn past_end(image: &[u8]) -> (&'static str, u64, u64, u64) {
        match ModuleImage::new(image) {
            Err(ImageError::PastEnd { what, offset, size, end }) => (what, offset, size, end),
            other => panic!("expected PastEnd, got {other:?}"),
        }
    }

    fn malformed(image: &[u8]) -> &'static str {
        match ModuleImage::new(image) {
            Err(ImageError::Malformed { reason, .. }) => reason,
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    #[test]
    fn a_minimal_cubin_is_accepted_as_it_is() {
        let elf = elf();
        let image = ModuleImage::new(&elf.image).unwrap();
        assert_eq!(image.kind(), &ImageKind::Cubin { sm: 90 });
        assert_eq!(image.into_bytes(), elf.image, "a cubin is loaded unchanged");
        // A section without contents in the file may point anywhere.
        let mut nobits = elf.image.clone();
        put(&mut nobits, elf.section(2, 4), &SHT_NOBITS.to_le_bytes());
        put(&mut nobits, elf.section(2, 24), &u64::MAX.to_le_bytes());
        put(&mut nobits, elf.section(2, 32), &u64::MAX.to_le_bytes());
        assert_eq!(ModuleImage::new(&nobits).unwrap().kind(), &ImageKind::Cubin { sm: 90 });
    }

    #[test]
    fn a_truncated_elf_header_is_refused() {
        let elf = elf();
        for len in [4, 40, 52, 63] {
            assert_eq!(past_end(&elf.image[..len]), ("ELF header", 0, 64, len as u64), "{len} bytes");
        }
    }

    #[test]
    fn tables_past_the_end_are_refused() {
        let elf = elf();
        let len = elf.image.len();
        // The section header table is last: every shorter image cuts it.
        let (what, offset, size, end) = past_end(&elf.image[..len - 1]);
        assert_eq!((what, offset, size, end), ("section header table", elf.shoff as u64, 5 * 64, len as u64 - 1));
        let cut = elf.shoff + 64;
        assert_eq!(past_end(&elf.image[..cut]).0, "section header table");
        // Offsets whose sum with the size overflows.
        let mut far = elf.image.clone();
        put(&mut far, 40, &(u64::MAX - 100).to_le_bytes());
        assert_eq!(past_end(&far), ("section header table", u64::MAX - 100, 320, len as u64));
        let mut far = elf.image.clone();
        put(&mut far, 32, &(len as u64).to_le_bytes());
        assert_eq!(past_end(&far), ("program header table", len as u64, 56, len as u64));
        // Too many headers for the bytes.
        let mut many = elf.image.clone();
        put(&mut many, 60, &255u16.to_le_bytes());
        assert_eq!(past_end(&many).0, "section header table");
    }

    #[test]
    fn sections_and_segments_past_the_end_are_refused() {
        let elf = elf();
        let len = elf.image.len() as u64;
        let mut past = elf.image.clone();
        put(&mut past, elf.section(2, 24), &(len - 8).to_le_bytes());
        assert_eq!(past_end(&past), ("section", len - 8, 16, len));
        let mut huge = elf.image.clone();
        put(&mut huge, elf.section(2, 32), &u64::MAX.to_le_bytes());
        assert_eq!(past_end(&huge).0, "section");
        let mut segment = elf.image.clone();
        put(&mut segment, elf.phoff + 32, &len.to_le_bytes());
        assert_eq!(past_end(&segment).0, "segment");
    }

    #[test]
    fn malformed_elf_files_are_refused() {
        let elf = elf();
        let mut other = elf.image.clone();
        other[4] = 1;
        assert_eq!(malformed(&other), "not a 64-bit ELF file");
        let mut other = elf.image.clone();
        other[5] = 2;
        assert_eq!(malformed(&other), "not a little-endian ELF file");
        let mut other = elf.image.clone();
        put(&mut other, 58, &40u16.to_le_bytes());
        assert_eq!(malformed(&other), "section headers smaller than 64 bytes");
        let mut other = elf.image.clone();
        put(&mut other, 60, &0u16.to_le_bytes());
        assert_eq!(malformed(&other), "extended section numbering (e_shnum = 0 with a section header table)");
        // Strings that would run on past their table.
        let mut other = elf.image.clone();
        let last = elf.section(3, 24);
        let strings_end = u64_at(&other, last) as usize + STRINGS.len() - 1;
        other[strings_end] = b'x';
        assert_eq!(malformed(&other), "a string table does not end with a NUL byte");
        let mut other = elf.image.clone();
        put(&mut other, elf.section(2, 0), &(NAMES.len() as u32).to_le_bytes());
        assert_eq!(malformed(&other), "a section name lies outside the section name table");
        let mut other = elf.image.clone();
        let symbol = u64_at(&other, elf.section(4, 24)) as usize + 24;
        put(&mut other, symbol, &(STRINGS.len() as u32).to_le_bytes());
        assert_eq!(malformed(&other), "a symbol name lies outside its string table");
        let mut other = elf.image.clone();
        put(&mut other, elf.section(4, 56), &16u64.to_le_bytes());
        assert_eq!(malformed(&other), "a symbol table's entries are not 24 bytes");
        let mut other = elf.image.clone();
        put(&mut other, elf.section(4, 40), &2u32.to_le_bytes()); // `.text`
        assert_eq!(malformed(&other), "a name table index does not name a string table");
    }

    #[test]
    fn ptx_is_text_ending_with_one_nul_at_most() {
        let ptx = b"//\n.version 8.0\n.target sm_90\n.address_size 64\n";
        let image = ModuleImage::new(ptx).unwrap();
        assert_eq!(image.kind(), &ImageKind::Ptx);
        let mut terminated = ptx.to_vec();
        terminated.push(0);
        assert_eq!(image.into_bytes(), terminated, "PTX without a NUL gets one");
        let image = ModuleImage::new(&terminated).unwrap();
        assert_eq!(image.into_bytes(), terminated, "PTX with its NUL is left as it is");
        let mut inner = ptx.to_vec();
        inner[3] = 0;
        assert_eq!(ModuleImage::new(&inner).unwrap_err(), ImageError::PtxNul { at: 3 });
        terminated.push(0);
        assert_eq!(ModuleImage::new(&terminated).unwrap_err(), ImageError::PtxNul { at: ptx.len() });
        // Binary formats the checks do not know are not text, whatever follows: the wrapper
        // struct `__fatBinC_Wrapper_t` (magic 0x466243B1) holds a pointer the driver would follow.
        let mut wrapper = 0x4662_43B1u32.to_le_bytes().to_vec();
        wrapper.extend_from_slice(ptx);
        assert_eq!(ModuleImage::new(&wrapper).unwrap_err(), ImageError::PtxNotText { at: 0 });
        assert_eq!(ModuleImage::new(b"hello").unwrap_err(), ImageError::NotAnImage);
        assert_eq!(ModuleImage::new(b"").unwrap_err(), ImageError::NotAnImage);
    }

    #[test]
    fn a_fat_binary_is_accepted_when_its_entries_are_complete() {
        let elf = elf();
        let ptx = b".version 8.0\n.target sm_90\n\0\0\0\0";
        let image = fatbin(&[(FATBIN_ELF, &elf.image), (1, ptx)]);
        let checked = ModuleImage::new(&image).unwrap();
        assert_eq!(checked.kind(), &ImageKind::Fatbin);
        assert_eq!(checked.into_bytes(), image);
        assert_eq!(ModuleImage::new(&fatbin(&[])).unwrap().kind(), &ImageKind::Fatbin);
    }

    #[test]
    fn truncated_fat_binaries_are_refused() {
        let magic = FATBIN_MAGIC.to_le_bytes();
        assert_eq!(past_end(&magic), ("fat binary header", 0, 16, 4));
        let elf = elf();
        let image = fatbin(&[(FATBIN_ELF, &elf.image)]);
        let len = image.len() as u64;
        // The header's size of the entries runs past the bytes.
        assert_eq!(past_end(&image[..image.len() - 1]), ("fat binary entries", 16, len - 16, len - 1));
        let mut big = image.clone();
        put(&mut big, 8, &u64::MAX.to_le_bytes());
        assert_eq!(past_end(&big), ("fat binary entries", 16, u64::MAX, len));
        // An entry whose payload runs past the entries' end.
        let mut payload = image.clone();
        put(&mut payload, 16 + 8, &(elf.image.len() as u64 + 1).to_le_bytes());
        assert_eq!(past_end(&payload), ("fat binary entry payload", 80, elf.image.len() as u64 + 1, len));
        // Entries that stop short of the end: the rest is no entry header.
        let mut short = image.clone();
        put(&mut short, 8, &(len - 16 + 8).to_le_bytes());
        short.extend_from_slice(&[0; 8]);
        assert_eq!(past_end(&short), ("fat binary entry header", len, 64, len + 8));
        let mut small = image.clone();
        put(&mut small, 16 + 4, &16u32.to_le_bytes());
        assert_eq!(malformed(&small), "an entry header smaller than 64 bytes");
        let mut version = image.clone();
        put(&mut version, 4, &2u16.to_le_bytes());
        assert_eq!(malformed(&version), "unknown version (not 1)");
        // A truncated cubin inside a complete entry.
        let inner = fatbin(&[(FATBIN_ELF, &elf.image[..elf.image.len() - 1])]);
        match ModuleImage::new(&inner) {
            Err(ImageError::InFatBinary { entry: 16, cubin }) => {
                assert!(matches!(*cubin, ImageError::PastEnd { what: "section header table", .. }), "{cubin}")
            }
            other => panic!("expected InFatBinary, got {other:?}"),
        }
    }

    /// [`elf`] with a sixth section, relocations of `kind` (`SHT_REL` or `SHT_RELA`) against
    /// `.text` (section 2, 16 bytes) with `.symtab` (section 4, 2 symbols) as their symbols: one
    /// entry per `(r_offset, r_info)`. The section header table moves to the end.
    fn elf_with_relocations(kind: u32, relocations: &[(u64, u64)]) -> Elf {
        let elf = elf();
        let entry = if kind == SHT_RELA { RELA } else { REL } as usize;
        let mut image = elf.image.clone();
        let at = image.len().next_multiple_of(8);
        image.resize(at + relocations.len() * entry, 0);
        for (i, (offset, info)) in relocations.iter().enumerate() {
            put(&mut image, at + i * entry, &offset.to_le_bytes());
            put(&mut image, at + i * entry + 8, &info.to_le_bytes());
        }
        let shoff = image.len().next_multiple_of(8);
        image.resize(shoff, 0);
        image.extend_from_slice(&elf.image[elf.shoff..]);
        image.extend_from_slice(&[0; SECTION_HEADER as usize]);
        put(&mut image, 40, &(shoff as u64).to_le_bytes());
        put(&mut image, 60, &6u16.to_le_bytes());
        let elf = Elf { image, phoff: elf.phoff, shoff };
        let mut image = elf.image.clone();
        put(&mut image, elf.section(5, 4), &kind.to_le_bytes());
        put(&mut image, elf.section(5, 24), &(at as u64).to_le_bytes());
        put(&mut image, elf.section(5, 32), &((relocations.len() * entry) as u64).to_le_bytes());
        put(&mut image, elf.section(5, 40), &4u32.to_le_bytes()); // `.symtab`
        put(&mut image, elf.section(5, 44), &2u32.to_le_bytes()); // `.text`
        put(&mut image, elf.section(5, 56), &(entry as u64).to_le_bytes());
        Elf { image, ..elf }
    }

    /// `r_info` of a relocation of type 1 against `symbol`.
    fn info(symbol: u64) -> u64 {
        (symbol << 32) | 1
    }

    #[test]
    fn header_strides_other_than_the_elf64_sizes_are_refused() {
        let elf = elf();
        // A 128-byte stride over the section headers: the table's bytes hold 2 such headers, the
        // second slot being the `.text` header a 64-byte reader would see as section 2.
        let mut stride = elf.image.clone();
        put(&mut stride, 58, &128u16.to_le_bytes());
        put(&mut stride, 60, &2u16.to_le_bytes());
        assert_eq!(
            ModuleImage::new(&stride).unwrap_err(),
            ImageError::Malformed { format: "ELF cubin", reason: "section headers larger than 64 bytes" }
        );
        let mut stride = elf.image.clone();
        put(&mut stride, 54, &112u16.to_le_bytes());
        assert_eq!(
            ModuleImage::new(&stride).unwrap_err(),
            ImageError::Malformed { format: "ELF cubin", reason: "program headers larger than 56 bytes" }
        );
        let mut small = elf.image.clone();
        put(&mut small, 54, &48u16.to_le_bytes());
        assert_eq!(malformed(&small), "program headers smaller than 56 bytes");
        // Without program headers, their size is not read.
        let mut none = elf.image.clone();
        put(&mut none, 54, &0u16.to_le_bytes());
        put(&mut none, 56, &0u16.to_le_bytes());
        assert!(ModuleImage::new(&none).is_ok());
    }

    #[test]
    fn a_cubin_without_a_section_name_table_is_refused() {
        let elf = elf();
        let mut zero = elf.image.clone();
        put(&mut zero, 62, &0u16.to_le_bytes());
        assert_eq!(
            ModuleImage::new(&zero).unwrap_err(),
            ImageError::Malformed { format: "ELF cubin", reason: "no section name table (e_shstrndx = 0)" }
        );
        let mut past = elf.image.clone();
        put(&mut past, 62, &5u16.to_le_bytes());
        assert_eq!(malformed(&past), "the section name table index (e_shstrndx) is not below e_shnum");
        let mut extended = elf.image.clone();
        put(&mut extended, 62, &SHN_XINDEX.to_le_bytes());
        assert_eq!(malformed(&extended), "extended section numbering (e_shstrndx = SHN_XINDEX)");
    }

    #[test]
    fn symbols_name_a_section_or_a_reserved_index() {
        let elf = elf();
        let shndx = u64_at(&elf.image, elf.section(4, 24)) as usize + 24 + 6;
        for ok in [SHN_UNDEF, 2, 4, SHN_ABS, SHN_COMMON] {
            let mut image = elf.image.clone();
            put(&mut image, shndx, &ok.to_le_bytes());
            assert!(ModuleImage::new(&image).is_ok(), "st_shndx {ok:#x}");
        }
        for bad in [5u16, 0xff00, 0xfff3, SHN_XINDEX] {
            let mut image = elf.image.clone();
            put(&mut image, shndx, &bad.to_le_bytes());
            assert_eq!(
                ModuleImage::new(&image).unwrap_err(),
                ImageError::Malformed {
                    format: "ELF cubin",
                    reason: "a symbol's section index (st_shndx) is neither a section nor SHN_UNDEF, SHN_ABS or \
                             SHN_COMMON"
                },
                "st_shndx {bad:#x}"
            );
        }
    }

    #[test]
    fn relocations_stay_within_their_symbols_and_target() {
        let refused = |reason| ImageError::Malformed { format: "ELF cubin", reason };
        // Within bounds, with and without addends.
        for kind in [SHT_REL, SHT_RELA] {
            let elf = elf_with_relocations(kind, &[(0, info(0)), (15, info(1))]);
            assert_eq!(ModuleImage::new(&elf.image).unwrap().kind(), &ImageKind::Cubin { sm: 90 }, "type {kind}");
        }
        let elf = elf_with_relocations(SHT_RELA, &[(8, info(1))]);
        let mut entsize = elf.image.clone();
        put(&mut entsize, elf.section(5, 56), &16u64.to_le_bytes());
        assert_eq!(
            ModuleImage::new(&entsize).unwrap_err(),
            refused("a relocation section's entries are not 16 (SHT_REL) or 24 (SHT_RELA) bytes")
        );
        let mut link = elf.image.clone();
        put(&mut link, elf.section(5, 40), &3u32.to_le_bytes()); // `.strtab`
        assert_eq!(
            ModuleImage::new(&link).unwrap_err(),
            refused("a relocation section's sh_link does not name a symbol table")
        );
        let mut target = elf.image.clone();
        put(&mut target, elf.section(5, 44), &6u32.to_le_bytes());
        assert_eq!(
            ModuleImage::new(&target).unwrap_err(),
            refused("a relocation section's target (sh_info) is not a section")
        );
        let symbol = elf_with_relocations(SHT_RELA, &[(8, info(2))]);
        assert_eq!(
            ModuleImage::new(&symbol.image).unwrap_err(),
            refused("a relocation's symbol index lies past its symbol table")
        );
        let symbol = elf_with_relocations(SHT_REL, &[(8, info(u64::from(u32::MAX)))]);
        assert_eq!(
            ModuleImage::new(&symbol.image).unwrap_err(),
            refused("a relocation's symbol index lies past its symbol table")
        );
        for offset in [16, u64::MAX] {
            let outside = elf_with_relocations(SHT_REL, &[(offset, info(1))]);
            assert_eq!(
                ModuleImage::new(&outside.image).unwrap_err(),
                refused("a relocation's offset lies outside its target section"),
                "r_offset {offset}"
            );
        }
    }

    #[test]
    fn a_fat_binary_header_size_is_16_bytes() {
        // A header size of 24 with 8 bytes of padding: a reader assuming 16 parses other entries.
        let elf = elf();
        let image = fatbin(&[(FATBIN_ELF, &elf.image)]);
        let mut padded = image[..16].to_vec();
        put(&mut padded, 6, &24u16.to_le_bytes());
        padded.extend_from_slice(&[0; 8]);
        padded.extend_from_slice(&image[16..]);
        assert_eq!(
            ModuleImage::new(&padded).unwrap_err(),
            ImageError::Malformed { format: "fat binary", reason: "a header size other than 16 bytes" }
        );
        let mut small = image.clone();
        put(&mut small, 6, &8u16.to_le_bytes());
        assert_eq!(malformed(&small), "a header size other than 16 bytes");
    }

    #[test]
    fn a_fat_binary_ptx_entry_holds_a_nul() {
        let ptx = b".version 8.0\n.target sm_90\n";
        assert_eq!(
            ModuleImage::new(&fatbin(&[(FATBIN_PTX, ptx)])).unwrap_err(),
            ImageError::Malformed { format: "fat binary", reason: "a PTX entry without a NUL byte in its payload" }
        );
        assert_eq!(malformed(&fatbin(&[(FATBIN_PTX, b"")])), "a PTX entry without a NUL byte in its payload");
        let mut terminated = ptx.to_vec();
        terminated.push(0);
        assert!(ModuleImage::new(&fatbin(&[(FATBIN_PTX, &terminated)])).is_ok());
    }

    #[test]
    fn compressed_fat_binary_entries_are_refused() {
        let elf = elf();
        let ptx = b".version 8.0\n.target sm_90\n\0\0\0\0";
        let image = fatbin(&[(FATBIN_PTX, ptx), (FATBIN_ELF, &elf.image)]);
        // nvcc's flags: 64-bit, Linux (and 0x1000000 on newer architectures' entries).
        let mut plain = image.clone();
        put(&mut plain, 16 + 40, &0x0100_0011u64.to_le_bytes());
        assert!(ModuleImage::new(&plain).is_ok());
        // The audit's flags 0x2011 on the second entry, whose payload is still a valid cubin.
        let second = 16 + 64 + ptx.len();
        let mut compressed = image.clone();
        put(&mut compressed, second + 40, &0x2011u64.to_le_bytes());
        assert_eq!(ModuleImage::new(&compressed).unwrap_err(), ImageError::CompressedEntry { entry: second as u64 });
        let mut compressed = image.clone();
        put(&mut compressed, 16 + 40, &0x2011u64.to_le_bytes());
        assert_eq!(ModuleImage::new(&compressed).unwrap_err(), ImageError::CompressedEntry { entry: 16 });
        assert!(ImageError::CompressedEntry { entry: 16 }.to_string().contains(
            "compressed fat binary entries are not accepted: the driver would decompress sizes the checks cannot \
             verify; build it uncompressed (nvcc --compress-mode=none from CUDA 12.4 on, and without -Xfatbin \
             -compress-all), or load a cubin (nvcc -cubin)"
        ));
    }

    #[test]
    fn fat_binary_entries_of_unknown_kinds_are_refused() {
        let elf = elf();
        for kind in [0u16, 3, 4, 0x8000] {
            assert_eq!(
                ModuleImage::new(&fatbin(&[(kind, &elf.image)])).unwrap_err(),
                ImageError::Malformed {
                    format: "fat binary",
                    reason: "an entry of an unknown kind (neither 1, PTX, nor 2, ELF)"
                },
                "kind {kind}"
            );
        }
        // An ELF entry holds an ELF file (compressed ones are refused before).
        assert_eq!(
            malformed(&fatbin(&[(FATBIN_ELF, b"not an ELF file\0")])),
            "an ELF entry whose payload is not an ELF file"
        );
    }

    #[test]
    fn messages_say_what_and_where() {
        assert_eq!(
            ModuleImage::new(&FATBIN_MAGIC.to_le_bytes()).unwrap_err().to_string(),
            "the image is truncated or corrupt: its fat binary header (16 bytes at byte 0) runs past its end at byte 4, \
             where the driver would go on reading"
        );
        assert_eq!(ImageError::PtxNul { at: 7 }.to_string(), "the PTX text has a NUL byte at byte 7, before its end");
    }
}
