//! Module images are checked before the driver reads them (`gpucomm_ordering::ModuleImage`):
//! `cuModuleLoadData` takes no length, so a truncated image handed over from a byte slice made the
//! driver read past the slice. The images the workspace compiles are accepted, and their
//! truncations refused, by the checks (no GPU needed) and by the loaders of both crates (on a
//! GPU); an NVSHMEM module dropped inside a capture stays loaded instead of breaking it.

use cudarc::driver::CudaContext;
use gpucomm_ordering::{ImageError, ImageKind, ModuleImage};
use gpucomm_tests::{multi_process, require_gpus, skip};
use nvshmem::launch::{Options, Rendezvous};
use nvshmem::Runtime;

/// The images `build.rs` compiled.
#[allow(dead_code)]
mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// The plain kernels for sm_80 and sm_100 only: a fat binary of two cubins.
const OTHER_ARCH: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/other_arch.fatbin"));

/// What a build for `archs` makes: a cubin for one architecture, a fat binary for several.
fn compiled(archs: &[u32]) -> ImageKind {
    match archs {
        [sm] => ImageKind::Cubin { sm: *sm },
        _ => ImageKind::Fatbin,
    }
}

/// Lengths to cut an image of `len` bytes to: every one within the first 64 bytes (the headers),
/// about a thousand spread over the rest, and one byte short.
fn cuts(len: usize) -> impl Iterator<Item = usize> {
    (0..len.min(64)).chain((64..len).step_by(len / 1000 + 1)).chain([len - 1])
}

#[test]
fn the_compiled_images_are_accepted_and_their_truncations_refused() {
    const TEST: &str = "the_compiled_images_are_accepted_and_their_truncations_refused";
    if !kernels::COMPILED || !gpucomm_kernels::image::COMPILED {
        return skip(TEST, "the .cu files were not compiled in this build");
    }
    let images = [
        ("the suites' plain kernels", kernels::PLAIN, compiled(kernels::ARCHS)),
        ("the suites' NVSHMEM kernels", kernels::NVSHMEM_KERNELS, compiled(kernels::ARCHS)),
        ("the sm_80 and sm_100 fat binary", OTHER_ARCH, ImageKind::Fatbin),
        ("gpucomm-kernels' all-reduce", gpucomm_kernels::image::LSA_ALLREDUCE, compiled(gpucomm_kernels::image::ARCHS)),
    ];
    for (name, image, kind) in images {
        let checked = ModuleImage::new(image).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(checked.kind(), &kind, "{name}");
        assert_eq!(checked.into_bytes(), image, "{name} is loaded as it is");
        let fatbin = kind == ImageKind::Fatbin;
        for len in cuts(image.len()) {
            let err = ModuleImage::new(&image[..len]).expect_err(name);
            match (len, err) {
                // Too short for the magic: nothing the checks know.
                (0..4, ImageError::NotAnImage) => {}
                (4..16, ImageError::PastEnd { what: "fat binary header", end, .. }) if fatbin => {
                    assert_eq!(end, len as u64)
                }
                // nvcc's fat binaries end with their last entry, as their header says.
                (16.., ImageError::PastEnd { what: "fat binary entries", offset: 16, size, end }) if fatbin => {
                    assert_eq!((size, end), (image.len() as u64 - 16, len as u64), "{name}")
                }
                (4..64, ImageError::PastEnd { what: "ELF header", end, .. }) if !fatbin => assert_eq!(end, len as u64),
                // A cubin's tables come last: any cut reaches into them.
                (64.., ImageError::PastEnd { end, .. }) if !fatbin => assert_eq!(end, len as u64, "{name}"),
                (_, err) => panic!("{name} cut to {len} bytes: {err}"),
            }
        }
    }
}

/// Audit: `nccl::device::load_module` handed any slice to `cuModuleLoadData`; one byte short of a
/// cubin, the driver read that byte past the slice. Now refused with `Error::ModuleImage` before
/// the driver is called; the whole image loads.
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn nccl_loads_whole_images_only() {
    let Some(streams) = require_gpus("nccl_loads_whole_images_only", 1) else { return };
    let ctx: &std::sync::Arc<CudaContext> = streams[0].context();
    let image = kernels::PLAIN;
    match nccl::device::load_module(ctx, &image[..image.len() - 1]) {
        Err(nccl::Error::ModuleImage(ImageError::PastEnd { end, .. })) => assert_eq!(end, image.len() as u64 - 1),
        other => panic!("a truncated cubin: {other:?}"),
    }
    let module = nccl::device::load_module(ctx, image).expect("the whole cubin");
    module.load_function("busy_for").expect("a kernel of the plain module");
}

/// Audit: `Module`'s drop waited for the device (`cuCtxSynchronize`, or a helper thread's) and
/// finalised the module even while this thread captured a graph: CUDA refuses the host wait
/// inside a capture and breaks the capture, and NVSHMEM exits the process when a call of its own
/// is refused so. Now a module dropped inside a capture stays loaded (with a warning) and the
/// capture goes on. Also: `Runtime::load_module` refuses a truncated image before the driver
/// (`Error::ModuleImage`).
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn an_nvshmem_module_dropped_inside_a_capture_stays_loaded() {
    multi_process("an_nvshmem_module_dropped_inside_a_capture_stays_loaded", 1, |info, stream| {
        let mut rdzv = Rendezvous::connect(&info, &Options::from_env().unwrap()).unwrap();
        let rt = Runtime::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        let image = kernels::NVSHMEM_KERNELS;
        match rt.load_module(&image[..image.len() - 1]) {
            Err(nvshmem::Error::ModuleImage(ImageError::PastEnd { end, .. })) => {
                assert_eq!(end, image.len() as u64 - 1)
            }
            other => panic!("a truncated cubin: {other:?}"),
        }

        let module = rt.load_module(image).unwrap();
        module.kernel("ring_put_plain").unwrap();
        let s = stream.context().new_stream().unwrap();
        let graph = nvshmem::capture(&s, &rt, |rt| {
            drop(module);
            rt.quiet_on_stream(&s)
        })
        .map_err(|(_, e)| e)
        .expect("a capture in which a module was dropped");
        drop(graph);

        // The runtime goes on: another module loads, and NVSHMEM finalises.
        let again = rt.load_module(image).unwrap();
        again.kernel("ring_put_plain").unwrap();
        drop(again);
        rt.finalize().map_err(|(_, e)| e).unwrap();
    });
}
