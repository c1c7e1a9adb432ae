//! NVLink error counters read before and after the live layer's load. Counters since boot are
//! history (a VM's links may have logged CRC errors long ago); counters that grow while the
//! doctor's own load runs are the verdict.

use serde::Serialize;

use super::report::{Check, Layer, Status};
use super::source::{normalize_bus_id, LinkErrors, Machine};

const L: Layer = Layer::Live;

/// How much one link's counters grew; `None` where either read had no value (or the counter
/// went down: a reset in between).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinkGrowth {
    /// NVML index of the GPU.
    pub gpu: usize,
    /// Link number.
    pub link: u32,
    /// CRC errors (flit + data).
    pub crc: Option<u64>,
    /// Replays.
    pub replay: Option<u64>,
    /// Recoveries.
    pub recovery: Option<u64>,
}

impl LinkGrowth {
    fn any(&self) -> bool {
        [self.crc, self.replay, self.recovery].iter().any(|v| v.unwrap_or(0) > 0)
    }

    /// Every counter's growth is known.
    fn read(&self) -> bool {
        [self.crc, self.replay, self.recovery].iter().all(Option::is_some)
    }
}

/// The growth of every link that both reads saw, GPU by GPU, on the GPUs that carried the load:
/// those at the PCI addresses `loaded` (the live ranks' devices). The other GPUs NVML sees ran
/// nothing of the doctor's, so their counters say nothing about this load.
pub fn growth(before: &Machine, after: &Machine, loaded: &[String]) -> Vec<LinkGrowth> {
    let delta = |a: Option<u64>, b: Option<u64>| b?.checked_sub(a?);
    let loaded: Vec<String> = loaded.iter().map(|b| normalize_bus_id(b)).collect();
    let mut out = Vec::new();
    for g in before.gpus.iter().filter(|g| loaded.contains(&normalize_bus_id(&g.bus_id))) {
        let Some(g2) = after.gpu(g.index) else { continue };
        for l in &g.links {
            let Some(l2) = g2.links.iter().find(|x| x.link == l.link) else { continue };
            let (a, b): (&LinkErrors, &LinkErrors) = (&l.errors, &l2.errors);
            out.push(LinkGrowth {
                gpu: g.index,
                link: l.link,
                crc: delta(a.crc, b.crc),
                replay: delta(a.replay, b.replay),
                recovery: delta(a.recovery, b.recovery),
            });
        }
    }
    out
}

fn plus(v: Option<u64>) -> String {
    v.map_or("?".to_string(), |v| format!("+{v}"))
}

fn counts(crc: Option<u64>, replay: Option<u64>, recovery: Option<u64>) -> String {
    format!("CRC {}, replay {}, recovery {}", plus(crc), plus(replay), plus(recovery))
}

/// One check per GPU: ✓ no growth on any link (every counter of every link read), • no growth on
/// the links read while some could not be (unreadable, or reset in between), ! CRC or replay
/// errors grew (the link retransmitted: data is intact, bandwidth suffers), ✗ recoveries grew (the
/// link retrained under load).
pub fn checks(growth: &[LinkGrowth]) -> Vec<Check> {
    let mut gpus: Vec<usize> = growth.iter().map(|g| g.gpu).collect();
    gpus.dedup();
    let mut out = Vec::new();
    for gpu in gpus {
        let links: Vec<&LinkGrowth> = growth.iter().filter(|g| g.gpu == gpu).collect();
        let sum = |f: fn(&LinkGrowth) -> Option<u64>| -> Option<u64> {
            let v: Vec<u64> = links.iter().filter_map(|l| f(l)).collect();
            (!v.is_empty()).then(|| v.iter().sum())
        };
        let (crc, replay, recovery) = (sum(|l| l.crc), sum(|l| l.replay), sum(|l| l.recovery));
        let grew: Vec<&&LinkGrowth> = links.iter().filter(|l| l.any()).collect();
        if [crc, replay, recovery].iter().all(Option::is_none) {
            out.push(Check::new(
                L,
                Status::Info,
                format!("GPU{gpu}: NVLink error counters unreadable before or after the live load"),
            ));
            continue;
        }
        let total = counts(crc, replay, recovery);
        if grew.is_empty() {
            let read = links.iter().filter(|l| l.read()).count();
            out.push(if read == links.len() {
                Check::new(
                    L,
                    Status::Pass,
                    format!(
                        "GPU{gpu}: NVLink error counters did not grow during the live load ({read} links: {total})"
                    ),
                )
            } else {
                Check::new(
                    L,
                    Status::Info,
                    format!(
                        "GPU{gpu}: NVLink error counters did not grow during the live load where read ({total}), \
                         but {} of {} links had a counter unreadable before or after the load (or reset in between)",
                        links.len() - read,
                        links.len()
                    ),
                )
            });
            continue;
        }
        let title = format!("GPU{gpu}: NVLink error counters grew during the live load: {total}");
        let detail = grew.iter().map(|l| format!("link {}: {}", l.link, counts(l.crc, l.replay, l.recovery)));
        let fix = "a link that logs errors under load is degrading: rerun the doctor to see whether they keep growing; reseat the NVLink bridge or board, or call the vendor (`nvidia-smi nvlink -e` shows the counters)";
        let check = if recovery.unwrap_or(0) > 0 {
            Check::fail(L, format!("{title} — the link retrained under load"), fix)
        } else {
            Check::warn(L, format!("{title} — the link retransmitted (data intact, bandwidth lost)"), fix)
        };
        out.push(check.with_detail(detail));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::source::fixtures::h200_pair;
    use super::*;

    #[test]
    fn growth_not_history_is_the_verdict() {
        let mut before = h200_pair();
        // A history of CRC errors since boot, as on the GPU machine.
        for g in &mut before.gpus {
            for (i, l) in g.links.iter_mut().enumerate() {
                l.errors.crc = Some(100 + i as u64);
            }
        }
        let mut after = before.clone();
        let read = |f| Machine::read(&f).unwrap();
        let both = ["0000:00:06.0".to_string(), "00000000:00:07.0".to_string()];
        let quiet = growth(&read(before.clone()), &read(after.clone()), &both);
        assert_eq!(quiet.len(), 36);
        let c = checks(&quiet);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].status, Status::Pass);
        assert_eq!(
            c[0].title,
            "GPU0: NVLink error counters did not grow during the live load (18 links: CRC +0, replay +0, recovery +0)"
        );

        after.gpus[1].links[3].errors.crc = Some(103 + 12);
        after.gpus[1].links[9].errors.replay = Some(2);
        let c = checks(&growth(&read(before.clone()), &read(after.clone()), &both));
        assert_eq!(c[0].status, Status::Pass);
        assert_eq!(c[1].status, Status::Warn);
        assert_eq!(
            c[1].title,
            "GPU1: NVLink error counters grew during the live load: CRC +12, replay +2, recovery +0 — the link \
             retransmitted (data intact, bandwidth lost)"
        );
        assert_eq!(c[1].detail, ["link 3: CRC +12, replay +0, recovery +0", "link 9: CRC +0, replay +2, recovery +0"]);

        after.gpus[0].links[0].errors.recovery = Some(1);
        let g = growth(&read(before.clone()), &read(after.clone()), &both);
        let c = checks(&g);
        assert_eq!(c[0].status, Status::Fail);
        assert!(c[0].title.ends_with("recovery +1 — the link retrained under load"), "{}", c[0].title);
        let json = serde_json::to_value(&g[0]).unwrap();
        assert_eq!(json, serde_json::json!({"gpu": 0, "link": 0, "crc": 0, "replay": 0, "recovery": 1}));
    }

    #[test]
    fn unreadable_or_reset_counters_are_not_growth() {
        let mut before = h200_pair();
        before.gpus.truncate(1);
        for l in &mut before.gpus[0].links {
            l.errors = LinkErrors::default();
        }
        let m = Machine::read(&before).unwrap();
        let gpu0 = ["0000:00:06.0".to_string()];
        let c = checks(&growth(&m, &m, &gpu0));
        assert_eq!(c[0].title, "GPU0: NVLink error counters unreadable before or after the live load");
        let mut after = h200_pair();
        after.gpus.truncate(1);
        let mut high = after.clone();
        high.gpus[0].links[5].errors.crc = Some(50);
        let g = growth(&Machine::read(&high).unwrap(), &Machine::read(&after).unwrap(), &gpu0);
        assert_eq!(g[5].crc, None);
        // A reset link's growth is unknown: no ✓ for all 18 links.
        let c = checks(&g);
        assert_eq!(c[0].status, Status::Info);
        assert_eq!(
            c[0].title,
            "GPU0: NVLink error counters did not grow during the live load where read (CRC +0, replay +0, \
             recovery +0), but 1 of 18 links had a counter unreadable before or after the load (or reset in between)"
        );
    }

    #[test]
    fn only_the_gpus_of_the_live_ranks_are_judged_and_unreadable_links_are_counted() {
        // Four GPUs, the live layer ran on two of them (--nproc 2, or CUDA_VISIBLE_DEVICES=2,3).
        let mut fake = h200_pair();
        let links = fake.gpus[0].links.clone();
        for (i, bus) in [(2, "0000:00:08.0"), (3, "0000:00:09.0")] {
            let mut g = fake.gpus[0].clone();
            (g.index, g.bus_id, g.links) = (i, bus.into(), links.clone());
            fake.gpus.push(g);
        }
        let m = Machine::read(&fake).unwrap();
        let ranks = ["00000000:00:08.0".to_string(), "0000:00:09.0".to_string()];
        let g = growth(&m, &m, &ranks);
        assert_eq!(g.len(), 36);
        let c = checks(&g);
        let titles: Vec<&str> = c.iter().map(|c| c.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "GPU2: NVLink error counters did not grow during the live load (18 links: CRC +0, replay +0, recovery +0)",
                "GPU3: NVLink error counters did not grow during the live load (18 links: CRC +0, replay +0, recovery +0)",
            ]
        );
        assert!(c.iter().all(|c| c.status == Status::Pass));
        // Two links of GPU3 whose replay counter NVML does not give: not a ✓ over all 18.
        fake.gpus[3].links[4].errors.replay = None;
        fake.gpus[3].links[7].errors.replay = None;
        let m = Machine::read(&fake).unwrap();
        let c = checks(&growth(&m, &m, &ranks));
        assert_eq!(c[1].status, Status::Info);
        assert_eq!(
            c[1].title,
            "GPU3: NVLink error counters did not grow during the live load where read (CRC +0, replay +0, recovery \
             +0), but 2 of 18 links had a counter unreadable before or after the load (or reset in between)"
        );
        // No rank reported its GPU: nothing is judged.
        assert!(growth(&m, &m, &[]).is_empty());
    }
}
