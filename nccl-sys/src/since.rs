//! The NCCL release that added each function newer than the oldest supported one (2.18.1), so
//! that a function missing from an older library is reported with the version it needs.
//! Source: the NCCL headers of each release (`nccl.h`, and `nccl_device.h` from 2.28); the CFT
//! functions of 2.31 from NCCL's Device API documentation ("available starting with NCCL 2.31").

const SINCE: &[(&str, &str)] = &[
    ("ncclMemAlloc", "2.19.1"),
    ("ncclMemFree", "2.19.1"),
    ("ncclCommRegister", "2.19.1"),
    ("ncclCommDeregister", "2.19.1"),
    ("ncclGroupSimulateEnd", "2.22.3"),
    ("ncclCommInitRankScalable", "2.23.4"),
    ("ncclResetDebugInit", "2.24.3"),
    ("ncclCommShrink", "2.27.3"),
    ("ncclCommWindowRegister", "2.27.3"),
    ("ncclCommWindowDeregister", "2.27.3"),
    ("ncclAlltoAll", "2.28.3"),
    ("ncclGather", "2.28.3"),
    ("ncclScatter", "2.28.3"),
    ("ncclDevCommCreate", "2.28.3"),
    ("ncclDevCommDestroy", "2.28.3"),
    ("ncclLsaBarrierCreateRequirement", "2.28.3"),
    ("ncclLLA2ACalcSlots", "2.28.3"),
    ("ncclLLA2ACreateRequirement", "2.28.3"),
    ("ncclTeamWorld", "2.28.3"),
    ("ncclTeamLsa", "2.28.3"),
    ("ncclTeamRail", "2.28.3"),
    ("ncclTeamRankToWorld", "2.28.3"),
    ("ncclTeamRankToLsa", "2.28.3"),
    ("ncclCommRevoke", "2.28.7"),
    ("ncclGinBarrierCreateRequirement", "2.28.7"),
    ("ncclCommGetUniqueId", "2.29.2"),
    ("ncclCommGrow", "2.29.2"),
    ("ncclPutSignal", "2.29.2"),
    ("ncclSignal", "2.29.2"),
    ("ncclWaitSignal", "2.29.2"),
    ("ncclWinGetUserPtr", "2.29.2"),
    ("ncclCommQueryProperties", "2.29.2"),
    ("ncclGetLsaDevicePointer", "2.29.2"),
    ("ncclGetPeerDevicePointer", "2.29.2"),
    ("ncclGetLsaMultimemDevicePointer", "2.29.2"),
    ("ncclGetMultimemDevicePointer", "2.29.2"),
    ("ncclCommSuspend", "2.29.7"),
    ("ncclCommResume", "2.29.7"),
    ("ncclCommMemStats", "2.29.7"),
    ("ncclGinOutboxCreateRequirement", "2.30.3"),
    ("ncclGinInboxA2ACreateRequirement", "2.30.3"),
    ("ncclParamBind", "2.30.4"),
    ("ncclParamGet", "2.30.4"),
    ("ncclParamGetStr", "2.30.4"),
    ("ncclParamGetParameter", "2.30.4"),
    ("ncclParamGetAllParameterKeys", "2.30.4"),
    ("ncclParamDumpAll", "2.30.4"),
    ("ncclAllReduceConfig", "2.31"),
    ("ncclBroadcastConfig", "2.31"),
    ("ncclReduceConfig", "2.31"),
    ("ncclAllGatherConfig", "2.31"),
    ("ncclReduceScatterConfig", "2.31"),
    ("ncclAlltoAllConfig", "2.31"),
    ("ncclGatherConfig", "2.31"),
    ("ncclScatterConfig", "2.31"),
    // Compute Fabric Transport and its logical endpoints ("available starting with NCCL 2.31").
    ("ncclTeamCft", "2.31"),
    ("ncclTeamCftMultimem", "2.31"),
    ("ncclGetCftDeviceLeInfo", "2.31"),
    ("ncclGetPeerDeviceLeInfo", "2.31"),
    ("ncclGetMultimemDeviceLeInfo", "2.31"),
    ("ncclSetEncryption", "2.32"),
];

/// The first NCCL version that exports `function`, for functions newer than 2.18.1.
/// `None` for functions present in every supported version (and for unknown names).
pub fn since(function: &str) -> Option<&'static str> {
    SINCE.iter().find(|(name, _)| *name == function).map(|&(_, v)| v).or_else(|| {
        // The typed ncclParamGet{I8..U64} getters all came with the Param API.
        function.strip_prefix("ncclParamGet").filter(|t| t.starts_with(['I', 'U'])).map(|_| "2.30.4")
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn lookups() {
        assert_eq!(super::since("ncclCommShrink"), Some("2.27.3"));
        assert_eq!(super::since("ncclParamGetU64"), Some("2.30.4"));
        assert_eq!(super::since("ncclAllReduce"), None);
        // Session 29 audit: bound from newer headers, missing in 2.18.1, and not listed.
        assert_eq!(super::since("ncclGetMultimemDevicePointer"), Some("2.29.2"));
        assert_eq!(super::since("ncclTeamCft"), Some("2.31"));
    }
}
