//! Stable sorting whose sort is compiled once.
//!
//! `slice::sort_by` is generic over its comparison, and every closure is a type of its own, so
//! each call site with its own closure carries its own copy of the sort: about 4 KB of machine
//! code each (92 copies were in the binary, 0.38 MB; docs/release.md). Here the sort runs once,
//! on indices, with the comparison behind `dyn`; what is left per call site is the small step
//! that puts the items in that order. For the lists these sort (listings, catalogues, a
//! directory's entries), the indirection costs nothing that matters; the hot paths do not sort.
//!
//! Same result as `slice::sort_by`: stable (equal items keep their order).

use std::cmp::Ordering;

/// Sorts `items` by `compare`, keeping equal items in their order.
pub fn sort_by<T>(items: &mut [T], mut compare: impl FnMut(&T, &T) -> Ordering) {
    let order = {
        let items = &*items;
        stable_order(items.len(), &mut |a, b| compare(&items[a], &items[b]))
    };
    permute(items, order);
}

/// Sorts `items` by the key `key` gives, keeping items with equal keys in their order.
pub fn sort_by_key<T, K: Ord>(items: &mut [T], mut key: impl FnMut(&T) -> K) {
    sort_by(items, |a, b| key(a).cmp(&key(b)))
}

/// The indices `0..len` in the order `compare` puts them, stable: the one sort.
fn stable_order(len: usize, compare: &mut dyn FnMut(usize, usize) -> Ordering) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    order.sort_by(|&a, &b| compare(a, b));
    order
}

/// Moves `items[order[i]]` to position `i` for every `i`, in place: each cycle of the
/// permutation is walked once with swaps (`order` is consumed as the record of what is done).
fn permute<T>(items: &mut [T], mut order: Vec<usize>) {
    for start in 0..items.len() {
        let mut at = start;
        // Position `at` takes what `order[at]` names; the item that was at `at` has moved on
        // to where the cycle goes next. `usize::MAX` marks a position already filled.
        while order[at] != usize::MAX {
            let from = order[at];
            order[at] = usize::MAX;
            if from == start {
                break;
            }
            items.swap(at, from);
            at = from;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator: the same cases every run.
    fn numbers(seed: u64, len: usize, range: u64) -> Vec<u64> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) % range
            })
            .collect()
    }

    #[test]
    fn sorts_as_the_standard_stable_sort_does() {
        for seed in 0..200 {
            let len = (seed as usize * 7) % 97;
            // Pairs (key, original position): equal keys must keep their positions' order.
            let keys = numbers(seed, len, 1 + seed % 13);
            let mut ours: Vec<(u64, usize)> = keys.iter().copied().zip(0..).collect();
            let mut std_sorted = ours.clone();
            sort_by_key(&mut ours, |&(key, _)| key);
            std_sorted.sort_by_key(|&(key, _)| key);
            assert_eq!(ours, std_sorted, "seed {seed}");
        }
    }

    #[test]
    fn descending_and_empty_and_owned_items() {
        let mut words: Vec<String> = ["b", "a", "c", "a"].iter().map(|s| s.to_string()).collect();
        sort_by(&mut words, |a, b| b.cmp(a));
        assert_eq!(words, ["c", "b", "a", "a"]);
        let mut none: Vec<String> = Vec::new();
        sort_by(&mut none, |a, b| a.cmp(b));
        assert!(none.is_empty());
    }
}
