use std::collections::HashMap;

use super::*;

fn parse(pairs: &[(&str, &str)]) -> Result<RankInfo, EnvError> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    RankInfo::from_vars(|name| map.get(name).cloned())
}

/// The identity's value.
fn identity(info: &RankInfo) -> Option<&str> {
    info.job_identity.as_ref().map(|id| id.value.as_str())
}

fn message(pairs: &[(&str, &str)]) -> String {
    match parse(pairs) {
        Ok(info) => panic!("expected an error, got {info:?}"),
        Err(e) => e.to_string(),
    }
}

const TORCH_R1: [(&str, &str); 4] =
    [("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")];

#[test]
fn no_launcher_is_a_single_process() {
    let info = parse(&[]).unwrap();
    assert_eq!(info, RankInfo::single());
    assert_eq!(info.launcher, Launcher::Single);
    // Empty values count as unset; MASTER_* are not needed by a single process.
    let info = parse(&[("RANK", ""), ("MASTER_PORT", "junk"), ("GPUCOMM_JOB_TOKEN", "t")]).unwrap();
    assert_eq!((info.rank, info.world_size, info.master), (0, 1, None));
    assert_eq!(info.job_identity, Some(JobIdentity { value: "t".into(), source: "GPUCOMM_JOB_TOKEN" }));
}

#[test]
fn torchrun_variables() {
    let mut vars = TORCH_R1.to_vec();
    vars.extend([
        ("MASTER_ADDR", "10.0.0.7"),
        ("MASTER_PORT", "1234"),
        ("TORCHELASTIC_RUN_ID", "abc"),
        ("TORCHELASTIC_RESTART_COUNT", "2"),
        ("GROUP_RANK", "0"),
        ("ROLE_RANK", "1"),
    ]);
    let info = parse(&vars).unwrap();
    assert_eq!(
        info,
        RankInfo {
            rank: 1,
            world_size: 2,
            local_rank: 1,
            local_world_size: 2,
            master: Some(Master { addr: "10.0.0.7".into(), port: 1234 }),
            launcher: Launcher::Torchrun,
            // Not the restart count: torchrun counts only this node's restarts, so the nodes of
            // one attempt may disagree (the rendezvous tells attempts apart itself).
            job_identity: Some(JobIdentity { value: "torchrun-abc".into(), source: "TORCHELASTIC_RUN_ID" }),
            torchelastic: Some(Torchelastic {
                run_id: "abc".into(),
                restart_count: 2,
                use_agent_store: false,
                group_rank: Some(0),
                role_rank: Some(1),
            }),
            gpus_per_task: None,
        }
    );
    assert_eq!(
        info.to_string(),
        "rank 1 of 2 (local 1 of 2) from torchrun-style variables, rendezvous at 10.0.0.7:1234"
    );
    // The token replaces the run id.
    vars.push(("GPUCOMM_JOB_TOKEN", "override"));
    let info = parse(&vars).unwrap();
    assert_eq!(identity(&info), Some("override"));
    assert_eq!(info.job_identity.unwrap().source, "GPUCOMM_JOB_TOKEN");
}

#[test]
fn torchruns_default_run_id_is_an_identity_only_under_the_agent_store() {
    let mut vars = TORCH_R1.to_vec();
    vars.extend([("TORCHELASTIC_RUN_ID", "none"), ("TORCHELASTIC_RESTART_COUNT", "0")]);
    let info = parse(&vars).unwrap();
    assert_eq!(info.job_identity, None);
    assert!(!info.torchelastic.unwrap().use_agent_store);
    vars.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
    let info = parse(&vars).unwrap();
    assert_eq!(identity(&info), Some("torchrun-none"));
    assert!(info.torchelastic.unwrap().use_agent_store);
    // torch.distributed checks for exactly "True".
    vars.pop();
    vars.push(("TORCHELASTIC_USE_AGENT_STORE", "true"));
    assert!(!parse(&vars).unwrap().torchelastic.unwrap().use_agent_store);
    // Inside a Slurm step, the step names the job.
    vars.extend([("SLURM_JOB_ID", "9"), ("SLURM_STEP_ID", "3")]);
    let info = parse(&vars).unwrap();
    assert_eq!(
        info.job_identity,
        Some(JobIdentity { value: "slurm-9.3".into(), source: "SLURM_JOB_ID and SLURM_STEP_ID" })
    );
    let mut bad = TORCH_R1.to_vec();
    bad.extend([("TORCHELASTIC_RUN_ID", "x"), ("TORCHELASTIC_RESTART_COUNT", "-1")]);
    assert!(message(&bad).starts_with("TORCHELASTIC_RESTART_COUNT=-1 is negative"));
    bad.pop();
    bad.push(("GROUP_RANK", "g"));
    assert!(message(&bad).starts_with("GROUP_RANK=g is not a number"));
}

#[test]
fn pmi_has_no_identity_of_its_own() {
    let pmi =
        [("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "2"), ("PMI_FD", "5")];
    assert_eq!(parse(&pmi).unwrap().job_identity, None);
    let mut token = pmi.to_vec();
    token.push(("GPUCOMM_JOB_TOKEN", "by-hand"));
    assert_eq!(identity(&parse(&token).unwrap()), Some("by-hand"));
}

#[test]
fn single_node_defaults_to_loopback_and_token_port() {
    let info = parse(&TORCH_R1).unwrap();
    assert_eq!(info.master, Some(Master { addr: "127.0.0.1".into(), port: DEFAULT_PORT }));
    let mut vars = TORCH_R1.to_vec();
    vars.push(("GPUCOMM_JOB_TOKEN", "job-42"));
    let port = parse(&vars).unwrap().master.unwrap().port;
    assert_eq!(port, Master::port_for_token("job-42"));
    assert!((20000..=29999).contains(&port));
    // FNV-1a 64 of the empty string is the offset basis 0xcbf29ce484222325.
    assert_eq!(Master::port_for_token(""), 20000 + (0xcbf2_9ce4_8422_2325u64 % 10000) as u16);
    assert_ne!(Master::port_for_token("job-42"), Master::port_for_token("job-43"));
}

#[test]
fn torchrun_partial_and_bad_values() {
    assert_eq!(
        message(&[("RANK", "0")]),
        "RANK is set but WORLD_SIZE is not (torchrun-style variables: set the missing variables, or unset the others)"
    );
    assert!(message(&[("WORLD_SIZE", "2")]).starts_with("WORLD_SIZE is set but RANK is not"));
    assert!(message(&[("RANK", "0"), ("WORLD_SIZE", "abc")]).starts_with("WORLD_SIZE=abc is not a number"));
    assert!(message(&[("RANK", "-1"), ("WORLD_SIZE", "2")]).starts_with("RANK=-1 is negative"));
    assert!(message(&[("RANK", "0"), ("WORLD_SIZE", "0")]).starts_with("WORLD_SIZE=0"));
    assert!(message(&[("RANK", "2"), ("WORLD_SIZE", "2")]).starts_with("RANK=2 is out of range for WORLD_SIZE=2"));
    let m = message(&[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert!(m.starts_with("RANK and WORLD_SIZE are set but LOCAL_RANK and LOCAL_WORLD_SIZE are not"), "{m}");
    assert!(message(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")])
        .starts_with("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"));
    let bad_local = [("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")];
    assert!(message(&bad_local).starts_with("LOCAL_RANK=2 is out of range for LOCAL_WORLD_SIZE=2"));
    let too_many = [("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "3")];
    assert!(message(&too_many).starts_with("LOCAL_WORLD_SIZE=3 is larger than WORLD_SIZE=2"));
    // World size 1 needs no local pair.
    let info = parse(&[("RANK", "0"), ("WORLD_SIZE", "1")]).unwrap();
    assert_eq!((info.local_rank, info.local_world_size), (0, 1));
}

#[test]
fn master_port_must_be_a_port() {
    for bad in ["abc", "0", "65536", "-5"] {
        let mut vars = TORCH_R1.to_vec();
        vars.push(("MASTER_PORT", bad));
        let m = message(&vars);
        assert!(m.starts_with(&format!("MASTER_PORT={bad} is not valid")), "{m}");
    }
}

#[test]
fn multi_node_without_master_addr_has_no_master() {
    let vars = [("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")];
    let info = parse(&vars).unwrap();
    assert_eq!(info.master, None);
    let m = info.master_or_err().unwrap_err().to_string();
    assert!(m.contains("MASTER_ADDR is not set") && m.contains("4 processes, 2 on this node"), "{m}");
    let mut vars = vars.to_vec();
    vars.push(("MASTER_ADDR", "node0"));
    assert_eq!(parse(&vars).unwrap().master_or_err().unwrap(), &Master { addr: "node0".into(), port: DEFAULT_PORT });
}

#[test]
fn slurm_variables() {
    let vars = [
        ("SLURM_PROCID", "3"),
        ("SLURM_STEP_NUM_TASKS", "6"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(x3)"),
        ("SLURM_JOB_NODELIST", "gpu[03-07,09],login1"),
        ("SLURM_JOB_ID", "777"),
        ("SLURM_STEP_ID", "2"),
    ];
    let info = parse(&vars).unwrap();
    assert_eq!((info.rank, info.world_size, info.local_rank, info.local_world_size), (3, 6, 1, 2));
    assert_eq!(info.launcher, Launcher::Slurm);
    assert_eq!(identity(&info), Some("slurm-777.2"));
    let port = Master::port_for_token("slurm-777.2");
    assert_eq!(info.master, Some(Master { addr: "gpu03".into(), port }));

    // The step's variables count, not the job's; SLURM_NODEID picks this node's entry.
    let step = [
        ("SLURM_PROCID", "4"),
        ("SLURM_NTASKS", "6"),
        ("SLURM_STEP_NUM_TASKS", "5"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NTASKS_PER_NODE", "2"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(x2),1"),
        ("SLURM_NODEID", "2"),
        ("SLURM_JOB_NODELIST", "gpu[03-07,09]"),
        ("SLURM_STEP_NODELIST", "n[1-2]x"),
        ("MASTER_PORT", "4000"),
    ];
    let info = parse(&step).unwrap();
    assert_eq!((info.rank, info.world_size, info.local_rank, info.local_world_size), (4, 5, 0, 1));
    assert_eq!(info.master, Some(Master { addr: "n1x".into(), port: 4000 }));

    // MASTER_ADDR wins over the node list.
    let mut with_addr = vars.to_vec();
    with_addr.push(("MASTER_ADDR", "10.1.1.1"));
    assert_eq!(parse(&with_addr).unwrap().master.unwrap().addr, "10.1.1.1");
}

#[test]
fn slurm_partial_and_bad_values() {
    assert!(
        message(&[("SLURM_STEP_NUM_TASKS", "2")]).starts_with("SLURM_STEP_NUM_TASKS is set but SLURM_PROCID is not")
    );
    let m = message(&[("SLURM_PROCID", "0"), ("SLURM_STEP_NUM_TASKS", "2"), ("SLURM_LOCALID", "0")]);
    assert!(m.starts_with("SLURM_LOCALID is set but SLURM_STEP_TASKS_PER_NODE is not"), "{m}");
    let m = message(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_STEP_NUM_TASKS", "2"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(3)"),
    ]);
    assert!(m.starts_with("SLURM_STEP_TASKS_PER_NODE=2(3) is not valid"), "{m}");
    let bad_list = [("SLURM_PROCID", "0"), ("SLURM_STEP_NUM_TASKS", "1"), ("SLURM_JOB_NODELIST", "gpu[1-")];
    assert!(message(&bad_list).starts_with("SLURM_JOB_NODELIST=gpu[1- is not valid"));
    // An allocation without a task (no SLURM_PROCID) is not a launcher.
    assert_eq!(parse(&[("SLURM_NTASKS", "4"), ("SLURM_JOB_ID", "1")]).unwrap().launcher, Launcher::Single);
}

/// What the batch script of `sbatch -N1 --ntasks-per-node=8` carries, and every process it
/// starts without `srun`: task 0 of the job's 8 (no step variables).
const SBATCH_SCRIPT: [(&str, &str); 6] = [
    ("SLURM_PROCID", "0"),
    ("SLURM_NTASKS", "8"),
    ("SLURM_LOCALID", "0"),
    ("SLURM_NTASKS_PER_NODE", "8"),
    ("SLURM_NODEID", "0"),
    ("SLURM_JOB_ID", "77"),
];

#[test]
fn a_batch_script_is_not_a_slurm_task() {
    // Before: the script's variables made a complete Slurm family of 8. A program started
    // directly took itself for rank 0 of 8 and waited for 7 ranks that never came, and under
    // `torchrun --nproc-per-node 8` in the script, ranks 1 to 7 failed at start with a conflict
    // (RANK=1 but SLURM_PROCID=0, same world size 8).
    assert_eq!(parse(&SBATCH_SCRIPT).unwrap().launcher, Launcher::Single);
    let mut torchrun = vec![("RANK", "1"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "8")];
    torchrun.extend(SBATCH_SCRIPT);
    let info = parse(&torchrun).unwrap();
    assert_eq!((info.launcher, info.rank, info.local_rank), (Launcher::Torchrun, 1, 1));
}

/// Task 2 of `srun -n 4` on one node (each task one GPU).
const SRUN_TASK_2: [(&str, &str); 5] = [
    ("SLURM_PROCID", "2"),
    ("SLURM_STEP_NUM_TASKS", "4"),
    ("SLURM_LOCALID", "2"),
    ("SLURM_STEP_TASKS_PER_NODE", "4"),
    ("SLURM_NODEID", "0"),
];

#[test]
fn srun_starting_torchrun_is_not_compared_with_it() {
    // `srun -N2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 1`: torchrun numbers the
    // nodes its own way (c10d sorts host names: node10 before node9), so the rank of the node's
    // only worker may differ from the agent's SLURM_PROCID at the same world size. Before: a
    // conflict, and the job died at start. (torchrun's agent always sets TORCHELASTIC_RUN_ID.)
    let mut vars = vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")];
    vars.extend([
        ("TORCHELASTIC_RUN_ID", "none"),
        ("SLURM_PROCID", "1"),
        ("SLURM_STEP_NUM_TASKS", "2"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
        ("SLURM_NODEID", "1"),
    ]);
    let info = parse(&vars).unwrap();
    assert_eq!((info.launcher, info.rank), (Launcher::Torchrun, 0));
}

#[test]
fn stale_torchrun_style_variables_under_srun_are_a_conflict() {
    // `export RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=4` in a batch script, then
    // `srun -n 4 ./prog`: every task inherits them. Before: all four took themselves for rank 0
    // of 4 (Slurm was never compared), and the rendezvous failed with a rank claimed four times.
    let mut vars = vec![("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "4")];
    vars.extend(SRUN_TASK_2);
    let err = parse(&vars).unwrap_err();
    assert_eq!(err, EnvError::Conflict { chosen: "RANK=0".into(), other: "SLURM_PROCID=2".into(), world_size: 4 });
    assert_eq!(
        err.to_string(),
        "RANK=0 but SLURM_PROCID=2 (same world size 4): two launchers disagree about this process's rank; \
         unset the stale variables or start the job with a single launcher"
    );
    // Variables that agree with Slurm's are fine (a wrapper that copies them).
    vars[0] = ("RANK", "2");
    assert_eq!((parse(&vars).unwrap().launcher, parse(&vars).unwrap().rank), (Launcher::Torchrun, 2));
    // Under `mpirun` in a Slurm step, Slurm describes mpirun's daemons: not compared.
    vars[0] = ("RANK", "0");
    vars.extend([
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ]);
    assert_eq!(parse(&vars).unwrap().rank, 0);
}

#[test]
fn torchrun_started_by_another_launcher_numbers_its_workers_itself() {
    // `mpirun -np 2 torchrun --nnodes 2 --nproc-per-node 1 ...` (or mpiexec, or a PMI launcher):
    // torchrun's rendezvous picks the node order, so its worker's RANK may differ from the
    // agent's MPI rank at the same world size. Before: a conflict, and the job died at start.
    let mut vars = vec![("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")];
    vars.extend([
        ("TORCHELASTIC_RUN_ID", "job-7"),
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
        ("PMI_RANK", "0"),
        ("PMI_SIZE", "2"),
        ("MPI_LOCALRANKID", "0"),
        ("MPI_LOCALNRANKS", "1"),
        ("SLURM_PROCID", "0"),
        ("SLURM_STEP_NUM_TASKS", "2"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
        ("SLURM_NODEID", "0"),
    ]);
    let info = parse(&vars).unwrap();
    assert_eq!((info.launcher, info.rank, info.world_size), (Launcher::Torchrun, 1, 2));
    // The same variables without TORCHELASTIC_RUN_ID were not set by torchrun: Open MPI's rank
    // disagrees.
    vars.retain(|(name, _)| *name != "TORCHELASTIC_RUN_ID");
    assert_eq!(
        parse(&vars).unwrap_err(),
        EnvError::Conflict { chosen: "RANK=1".into(), other: "OMPI_COMM_WORLD_RANK=0".into(), world_size: 2 }
    );
}

#[test]
fn srun_with_the_pmi2_plugin_is_a_slurm_task() {
    // `srun --mpi=pmi2` sets PMI_RANK and PMI_SIZE but not MPI_LOCALRANKID / MPI_LOCALNRANKS.
    // Before: PMI was chosen and refused as incomplete although Slurm described the task in full.
    let vars = [
        ("PMI_RANK", "3"),
        ("PMI_SIZE", "8"),
        ("SLURM_PROCID", "3"),
        ("SLURM_STEP_NUM_TASKS", "8"),
        ("SLURM_LOCALID", "3"),
        ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
        ("SLURM_NODEID", "0"),
    ];
    let info = parse(&vars).unwrap();
    assert_eq!(
        (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size),
        (Launcher::Slurm, 3, 8, 3, 4)
    );
    // Without srun, PMI without its local pair is still refused for more than one process.
    assert!(message(&vars[..2]).starts_with("PMI_RANK and PMI_SIZE are set but MPI_LOCALRANKID"));
}

#[test]
fn world_sizes_beyond_reason_are_refused() {
    // Before: WORLD_SIZE=4294967297 was taken, stored as 1 in the rendezvous's records, and rank
    // 0 built billions of keys; a count past 64 bits was "not a number".
    let vars = |size| [("RANK", "0"), ("WORLD_SIZE", size), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")];
    let m = message(&vars("4294967297"));
    assert!(m.starts_with("WORLD_SIZE=4294967297 is not valid: expected at most 1048576 processes"), "{m}");
    assert!(parse(&vars("1048576")).is_ok());
    let m = message(&vars("18446744073709551616"));
    assert!(m.contains("is not valid: expected a count that fits in 64 bits"), "{m}");
}

#[test]
fn open_mpi_variables() {
    let vars = [
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("PMIX_NAMESPACE", "prterun-host-123@1"),
        ("OMPI_MCA_ess_base_jobid", "99"),
    ];
    let info = parse(&vars).unwrap();
    assert_eq!((info.rank, info.world_size, info.local_rank, info.local_world_size), (1, 2, 1, 2));
    assert_eq!(info.launcher, Launcher::OpenMpi);
    assert_eq!(
        info.job_identity,
        Some(JobIdentity { value: "ompi-prterun-host-123@1".into(), source: "PMIX_NAMESPACE" })
    );
    assert_eq!(info.master.unwrap().addr, "127.0.0.1");
    assert_eq!(parse(&vars[..4]).unwrap().job_identity, None);
    assert!(message(&vars[..1]).starts_with("OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"));
}

#[test]
fn pmi_local_rule() {
    let full = [("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "2")];
    let info = parse(&full).unwrap();
    assert_eq!((info.rank, info.world_size, info.local_rank, info.local_world_size), (1, 2, 1, 2));
    assert_eq!(info.launcher, Launcher::Pmi);
    // Without the local pair: fine for one process, an error for more.
    let info = parse(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]).unwrap();
    assert_eq!((info.local_rank, info.local_world_size), (0, 1));
    let m = message(&full[..2]);
    assert!(m.starts_with("PMI_RANK and PMI_SIZE are set but MPI_LOCALRANKID and MPI_LOCALNRANKS are not"), "{m}");
}

#[test]
fn precedence_and_conflicts() {
    let slurm = [("SLURM_PROCID", "0"), ("SLURM_STEP_NUM_TASKS", "1")];
    // torchrun inside a Slurm allocation with a different world size: torchrun wins.
    let mut vars = TORCH_R1.to_vec();
    vars.extend(slurm);
    assert_eq!(parse(&vars).unwrap().launcher, Launcher::Torchrun);
    // Open MPI > PMI > Slurm.
    let ompi = [("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")];
    let pmi = [("PMI_RANK", "0"), ("PMI_SIZE", "1"), ("MPI_LOCALRANKID", "0"), ("MPI_LOCALNRANKS", "1")];
    let all: Vec<_> = ompi.iter().chain(&pmi).chain(&slurm).copied().collect();
    assert_eq!(parse(&all).unwrap().launcher, Launcher::OpenMpi);
    assert_eq!(parse(&all[2..]).unwrap().launcher, Launcher::Pmi);
    // Same world size, different ranks: a conflict.
    let mut conflict = TORCH_R1.to_vec();
    conflict[0] = ("RANK", "0");
    conflict[2] = ("LOCAL_RANK", "0");
    conflict.extend([
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ]);
    assert!(message(&conflict).starts_with("RANK=0 but OMPI_COMM_WORLD_RANK=1 (same world size 2)"));
    // Same ranks agree; an incomplete lower family is ignored.
    let mut agree = TORCH_R1.to_vec();
    agree.extend([("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "2")]);
    assert_eq!(parse(&agree).unwrap().launcher, Launcher::Torchrun);
    let mut stray = TORCH_R1.to_vec();
    stray.push(("PMI_RANK", "x"));
    assert_eq!(parse(&stray).unwrap().rank, 1);
}

#[test]
fn device_ordinal_rules() {
    let mut info = RankInfo::single();
    info.local_rank = 1;
    info.local_world_size = 2;
    assert_eq!(info.device_ordinal(2), Ok(1));
    assert_eq!(info.device_ordinal(1), Ok(0));
    assert_eq!(info.device_ordinal(0), Err(EnvError::NoDevice));
    assert!(info.device_ordinal(0).unwrap_err().to_string().starts_with("no CUDA device visible"));
    info.local_rank = 3;
    assert_eq!(info.device_ordinal(2), Err(EnvError::NotEnoughDevices { local_rank: 3, device_count: 2 }));
    assert_eq!(
        info.device_ordinal(2).unwrap_err().to_string(),
        "local rank 3 has no GPU of its own: only 2 CUDA devices are visible; start at most 2 processes per node, \
         or give each process its own GPUs: one through CUDA_VISIBLE_DEVICES, or with Slurm `srun \
         --gpus-per-task N` (which binds them to each task; SLURM_GPUS_PER_TASK then tells this process to use the \
         first)"
    );
}

#[test]
fn gpus_bound_to_each_slurm_task_are_its_own() {
    // `srun --ntasks-per-node 4 --gpus-per-task 2`: each task sees its own 2 GPUs. Before: local
    // rank 1 took its second GPU, and local ranks 2 and 3 failed ("start at most 2 processes per
    // node").
    let mut vars = SRUN_TASK_2.to_vec();
    vars.push(("SLURM_GPUS_PER_TASK", "2"));
    let info = parse(&vars).unwrap();
    assert_eq!((info.launcher, info.local_rank, info.gpus_per_task), (Launcher::Slurm, 2, Some(2)));
    assert_eq!(info.device_ordinal(2), Ok(0));
    // `--gpu-bind=none` lets every task see the node's 8 GPUs: the local rank picks.
    assert_eq!(info.device_ordinal(8), Ok(2));
    // Typed and listed counts add up.
    for (value, total) in [("a100:2", 2), ("a100:2,v100:1", 3), (" 4 ", 4)] {
        vars.pop();
        vars.push(("SLURM_GPUS_PER_TASK", value));
        assert_eq!(parse(&vars).unwrap().gpus_per_task, Some(total), "{value}");
    }
    for bad in ["two", "a100:", "0", "1,,1"] {
        vars.pop();
        vars.push(("SLURM_GPUS_PER_TASK", bad));
        assert_eq!(
            parse(&vars).unwrap_err().to_string(),
            format!(
                "SLURM_GPUS_PER_TASK={bad} is not valid: expected a GPU count per task such as 2, a100:2 or \
                 a100:2,v100:1"
            )
        );
    }
    // Only Slurm's tasks: under torchrun (started by srun), the workers share the agent's GPUs.
    let mut torchrun = vec![("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4")];
    torchrun.extend([("TORCHELASTIC_RUN_ID", "none"), ("SLURM_GPUS_PER_TASK", "4")]);
    let info = parse(&torchrun).unwrap();
    assert_eq!(info.gpus_per_task, None);
    assert_eq!(info.device_ordinal(4), Ok(1));
}

#[test]
fn launcher_and_master_display() {
    assert_eq!(Launcher::Torchrun.to_string(), "torchrun-style variables");
    assert_eq!(Master { addr: "::1".into(), port: 5 }.to_string(), "[::1]:5");
    assert_eq!(Master { addr: "h".into(), port: 5 }.to_string(), "h:5");
}

#[test]
fn a_token_that_is_not_utf8_is_refused() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let with = |token: Vec<u8>| {
        RankInfo::from_os_vars(|name| (name == "GPUCOMM_JOB_TOKEN").then(|| OsString::from_vec(token.clone())))
    };
    // Lossily, both would be "job-\u{fffd}": one job. The message does not show the token (the
    // job's identity; session 29 audit: it did).
    let e = with(b"job-\xff".to_vec()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "GPUCOMM_JOB_TOKEN=<5 bytes, not UTF-8> is not valid: expected UTF-8 text (tokens that differ only in other \
         bytes would name one job)"
    );
    assert_eq!(identity(&with(b"job-7".to_vec()).unwrap()), Some("job-7"));
}
