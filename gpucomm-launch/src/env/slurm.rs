//! Parsers for Slurm's compact list syntaxes.

/// The first host of a Slurm hostlist: `gpu[03-07,09],login1` → `gpu03`, `a,b` → `a`,
/// `n[1-2]x` → `n1x`, `r[1-2]-n[01-04]` → `r1-n01`.
///
/// Each bracket group is replaced by the first entry of its first range (zero padding is kept).
/// `None` when the list is empty or malformed (unbalanced brackets, an empty or non-numeric range).
pub(super) fn first_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut rest = list.trim();
    loop {
        let stop = rest.find(['[', ',']).unwrap_or(rest.len());
        let (plain, tail) = rest.split_at(stop);
        if plain.contains(']') {
            return None;
        }
        host.push_str(plain);
        match tail.chars().next() {
            Some('[') => {
                let close = tail.find(']')?;
                let group = &tail[1..close];
                let first = group.split(',').next().unwrap_or("");
                let start = first.split('-').next().unwrap_or("");
                if start.is_empty() || !start.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                host.push_str(start);
                rest = &tail[close + 1..];
            }
            // `,` ends the first host; end of input ends it too.
            _ => break,
        }
    }
    if host.is_empty() {
        None
    } else {
        Some(host)
    }
}

/// The number of tasks on node `node` of a Slurm tasks-per-node list such as `2`, `2(x3)` or
/// `4(x2),3`. Without a node index the list must give every node the same count.
///
/// `Err` holds a description of what was expected.
pub(super) fn tasks_on_node(spec: &str, node: Option<usize>) -> Result<usize, String> {
    let mut groups = Vec::new();
    for entry in spec.trim().split(',') {
        groups.push(
            parse_group(entry.trim())
                .ok_or_else(|| "a per-node task count list such as 2, 2(x3) or 4(x2),3".to_string())?,
        );
    }
    match node {
        Some(index) => {
            let mut first = 0usize;
            for &(count, repeat) in &groups {
                if index < first.saturating_add(repeat) {
                    return Ok(count);
                }
                first = first.saturating_add(repeat);
            }
            Err(format!("an entry for node {index} (SLURM_NODEID), but the list covers only {first} nodes"))
        }
        None => {
            let first = groups.first().map(|g| g.0).unwrap_or(0);
            if groups.iter().all(|g| g.0 == first) {
                Ok(first)
            } else {
                Err("the same count on every node, or SLURM_NODEID to pick this node's entry".to_string())
            }
        }
    }
}

/// `N` → `(N, 1)`, `N(xM)` → `(N, M)`.
fn parse_group(entry: &str) -> Option<(usize, usize)> {
    match entry.split_once('(') {
        None => Some((entry.parse().ok()?, 1)),
        Some((count, repeat)) => {
            let repeat = repeat.strip_prefix('x')?.strip_suffix(')')?;
            Some((count.parse().ok()?, repeat.parse().ok()?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_host_of_hostlists() {
        assert_eq!(first_host("gpu[03-07,09],login1").as_deref(), Some("gpu03"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("n[1-2]x").as_deref(), Some("n1x"));
        assert_eq!(first_host("r[1-2]-n[01-04]").as_deref(), Some("r1-n01"));
        assert_eq!(first_host("node7").as_deref(), Some("node7"));
        assert_eq!(first_host(" gpu[9] ").as_deref(), Some("gpu9"));
        assert_eq!(first_host("x[5,7-9]").as_deref(), Some("x5"));
        for bad in ["", ",a", "gpu[", "gpu[]", "gpu[a-b]", "gpu]1", "[-3]", "é[", "gpu[1-2"] {
            assert_eq!(first_host(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tasks_per_node_lists() {
        assert_eq!(tasks_on_node("2", None), Ok(2));
        assert_eq!(tasks_on_node("2(x3)", None), Ok(2));
        assert_eq!(tasks_on_node("2(x3)", Some(2)), Ok(2));
        assert_eq!(tasks_on_node("4(x2),3", Some(1)), Ok(4));
        assert_eq!(tasks_on_node("4(x2),3", Some(2)), Ok(3));
        assert!(tasks_on_node("4(x2),3", Some(3)).is_err());
        assert!(tasks_on_node("4(x2),3", None).is_err());
        for bad in ["", "x", "2(3)", "2(x)", "2(x3", "-1", "2,,3"] {
            assert!(tasks_on_node(bad, Some(0)).is_err(), "{bad:?}");
        }
    }
}
