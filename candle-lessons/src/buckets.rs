//! Gradient buckets the way PyTorch's DistributedDataParallel makes them.
//!
//! Gradients are all-reduced in buckets rather than one by one (fewer, larger NCCL calls) and not
//! all at once (the first buckets can travel while the backward pass is still computing the
//! rest). DDP's rules, copied here: parameters are taken in **reverse** order (the backward pass
//! produces the last layers' gradients first); a bucket is closed as soon as it holds at least its
//! size limit — 1 MiB for the first bucket (so that communication starts early), 25 MiB for the
//! others — so a tensor larger than the limit gets a bucket of its own.

/// PyTorch DDP's default size limit of every bucket after the first (`bucket_cap_mb = 25`).
pub const CAP_BYTES: usize = 25 << 20;
/// PyTorch DDP's size limit of the first bucket (`dist._DEFAULT_FIRST_BUCKET_BYTES`).
pub const FIRST_CAP_BYTES: usize = 1 << 20;

/// Groups tensors of `bytes[i]` bytes, listed in the order their gradients become ready, into
/// buckets: indices into `bytes`, in order, the first bucket closed at `first_cap` bytes, the
/// others at `cap`.
pub fn assign(bytes: &[usize], first_cap: usize, cap: usize) -> Vec<Vec<usize>> {
    let (mut buckets, mut current, mut size, mut limit) = (Vec::new(), Vec::new(), 0, first_cap);
    for (i, &b) in bytes.iter().enumerate() {
        current.push(i);
        size += b;
        if size >= limit {
            buckets.push(std::mem::take(&mut current));
            size = 0;
            limit = cap;
        }
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}

/// The layer whose backward pass completes a bucket of `params` (parameter indices, `layer_of`
/// giving each one's layer): the lowest of their layers, since the backward pass goes from the
/// last layer to the first. `None` for an empty bucket.
pub fn ready_after(params: &[usize], layer_of: impl Fn(usize) -> usize) -> Option<usize> {
    params.iter().map(|&i| layer_of(i)).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_ddp_limits() {
        const MIB: usize = 1 << 20;
        // Last layer first: its 4 KiB bias and 4 MiB weights close the 1 MiB first bucket; the
        // rest (12.6 MiB) fits one 25 MiB bucket.
        let bias = 4 << 10;
        let weights = 4 * MIB;
        let ready = [bias, weights, bias, weights, bias, weights, bias, weights];
        assert_eq!(assign(&ready, FIRST_CAP_BYTES, CAP_BYTES), vec![vec![0, 1], vec![2, 3, 4, 5, 6, 7]]);
        // A tensor over the limit gets a bucket of its own; a bucket closes at the limit exactly.
        assert_eq!(assign(&[30 * MIB, MIB, 24 * MIB, MIB], MIB, 25 * MIB), vec![vec![0], vec![1, 2], vec![3]]);
        assert!(assign(&[], MIB, 25 * MIB).is_empty());
    }

    #[test]
    fn a_bucket_is_ready_after_its_lowest_layer() {
        // Parameters `w0, b0, w1, b1, …`: parameter i belongs to layer i / 2.
        let layer = |i: usize| i / 2;
        assert_eq!(ready_after(&[7, 6], layer), Some(3));
        // A bucket that spans layers waits for the lowest one, in whatever order it lists them.
        assert_eq!(ready_after(&[5, 4, 3, 2, 1, 0], layer), Some(0));
        assert_eq!(ready_after(&[3, 4], layer), Some(1));
        assert_eq!(ready_after(&[], layer), None);
    }
}
