//! The host side of NCCL's device API on one GPU: what `DevComm::new` refuses before NCCL sees
//! it. Each test says what the code before the change did.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use gpucomm_tests::{require_gpus, skip};
use nccl::device::{DevComm, DevCommRequirements, ResourceBuffer};
use nccl::{group, Comm, Error, ResultCode, UniqueId};

/// A one-rank communicator on a non-blocking stream of the first GPU, or `None` after a skip.
fn one_rank(test: &str) -> Option<(Arc<CudaStream>, Comm)> {
    let streams = require_gpus(test, 1)?;
    let stream = streams[0].context().new_stream().expect("a stream");
    let comm = Comm::init_rank(stream.clone(), &UniqueId::new().unwrap(), 0, 1).expect("a one-rank communicator");
    Some((stream, comm))
}

/// Audit: `DevComm::new` inside a group closure. Before: it called `ncclDevCommCreate`, which NCCL
/// only records inside a group and carries out at the group's end, after the call had returned
/// (and read) the device communicator NCCL had not written yet. Now it is refused with
/// `Error::InsideGroup`, like every call a group would only record, and the refusal stops the
/// group even when the closure ignores it.
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn a_device_communicator_is_refused_inside_a_group() {
    const TEST: &str = "a_device_communicator_is_refused_inside_a_group";
    let Some((_stream, comm)) = one_rank(TEST) else { return };
    let reqs = DevCommRequirements::default().lsa_barriers(1);

    let err = group(|_| DevComm::new(&comm, &reqs).map(drop)).unwrap_err();
    assert!(matches!(err, Error::InsideGroup), "{err}");
    let mut inside = None;
    let err = group(|_| {
        inside = DevComm::new(&comm, &reqs).err();
        Ok(())
    })
    .unwrap_err();
    assert!(matches!(err, Error::GroupRefused { refused: 1 }), "{err}");
    assert!(matches!(inside, Some(Error::InsideGroup)), "{inside:?}");

    // Outside a group the same requirements make a device communicator.
    match DevComm::new(&comm, &reqs) {
        Ok(dev) => assert_eq!((dev.rank(), dev.lsa_rank(), dev.lsa_size()), (0, 0, 1), "{dev:?}"),
        Err(Error::Nccl { code: ResultCode::INVALID_USAGE, detail, .. }) => {
            skip(TEST, &format!("no device API on this communicator ({detail:?}): DevComm not created"))
        }
        Err(e) => panic!("DevComm::new outside a group: {e}"),
    }
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

/// Audit: sizes NCCL derives from the requirements in C ints (an LSA barrier takes
/// `(3 + LSA team size) × 4` bytes) and resource handles it truncates to 32 bits. Before: only the
/// counts were checked against `i32::MAX`, so 2^30 LSA barriers reached NCCL, whose int
/// arithmetic overflowed (undefined behaviour), and so did resource buffers whose offsets
/// overflowed `size_t`. Now both are refused before NCCL is called, with the team sizes of the
/// communicator.
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn requirements_whose_sizes_overflow_in_nccl_are_refused() {
    let Some((_stream, comm)) = one_rank("requirements_whose_sizes_overflow_in_nccl_are_refused") else { return };
    let err = DevComm::new(&comm, &DevCommRequirements::default().lsa_barriers(1 << 30)).unwrap_err();
    assert!(matches!(err, Error::RequirementTooLarge { what: "LSA barriers", value: 0x4000_0000 }), "{err}");
    let huge = DevCommRequirements::default()
        .resource_buffer(ResourceBuffer { size: usize::MAX - 127, align: 128 })
        .resource_buffer(ResourceBuffer { size: 256, align: 128 });
    let err = DevComm::new(&comm, &huge).unwrap_err();
    assert!(matches!(err, Error::ResourceWindowTooLarge { index: 0, align: 128, .. }), "{err}");
    let odd = DevCommRequirements::default().resource_buffer(ResourceBuffer { size: 64, align: 1 << 31 });
    let err = DevComm::new(&comm, &odd).unwrap_err();
    assert!(matches!(err, Error::InvalidAlignment { align: 0x8000_0000 }), "{err}");
    // Nothing reached NCCL: the communicator is as good as new.
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

/// Session 22: `DevComm::destroy` tells what dropping a device communicator only logged, and
/// hands it back. Inside a capture scope it is refused (`Error::ReleaseInCapture`: its wait for
/// the device would invalidate the capture); with the device busy past the communicator's
/// timeout it is `Error::StillInUse` after about the timeout (a kernel that received it may still
/// run); once the device is idle it is destroyed.
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn destroying_a_device_communicator_reports_why_it_is_kept() {
    const TEST: &str = "destroying_a_device_communicator_reports_why_it_is_kept";
    let Some((stream, comm)) = one_rank(TEST) else { return };
    let created = match DevComm::new(&comm, &DevCommRequirements::default().lsa_barriers(1)) {
        Ok(dev) => Some(dev),
        Err(Error::Nccl { code: ResultCode::INVALID_USAGE, detail, .. }) => {
            skip(TEST, &format!("no device API on this communicator ({detail:?})"));
            None
        }
        Err(e) => panic!("DevComm::new: {e}"),
    };
    if created.is_none() {
        drop(created);
        return comm.finalize().map_err(|(_, e)| e).unwrap();
    }
    let dev = created.unwrap();
    let mut kept = None;
    let graph = nccl::capture(&stream, (), |_| match dev_destroy_in(&mut kept, dev) {
        Error::ReleaseInCapture { what: "a DevComm" } => Ok(()),
        other => panic!("destroying inside a capture: {other}"),
    });
    drop(graph.map_err(|(_, e)| e).expect("the capture"));
    let dev = kept.expect("handed back");

    comm.set_timeout(Some(std::time::Duration::from_secs(1)));
    let side = stream.context().new_stream().unwrap();
    gpucomm_tests::occupy(&side, std::time::Duration::from_secs(4));
    let started = std::time::Instant::now();
    let (dev, e) = dev.destroy().expect_err("destroying while the device is busy");
    let took = started.elapsed();
    assert!(matches!(e, Error::StillInUse { what: "a DevComm", .. }), "{e}");
    assert!(
        took >= std::time::Duration::from_millis(900) && took < std::time::Duration::from_secs(3),
        "gave up after {took:?}"
    );
    side.synchronize().unwrap();
    dev.destroy().map_err(|(_, e)| e).expect("destroying once the device is idle");
    comm.set_timeout(None);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

/// Destroys `dev` (expected to be refused), keeps what comes back in `kept`, and returns the error.
fn dev_destroy_in<'c>(kept: &mut Option<DevComm<'c>>, dev: DevComm<'c>) -> Error {
    let (dev, e) = dev.destroy().expect_err("refused");
    *kept = Some(dev);
    e
}
