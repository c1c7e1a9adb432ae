// A graph keeps the team its captured collectives use: destroying the team while the graph lives
// does not compile.
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nvshmem::Runtime;

fn demo(rt: &Runtime, side: &Arc<CudaStream>) -> nvshmem::Result<()> {
    let team = rt.world()?.split_strided(0, 1, rt.n_pes())?.expect("every PE is in it");
    let mut graph = nvshmem::capture(side, (&team,), |(team,)| team.barrier_on_stream(side)).map_err(|(_, e)| e)?;
    team.destroy().map_err(|(_, e)| e)?;
    graph.launch()?;
    Ok(())
}

fn main() {}
