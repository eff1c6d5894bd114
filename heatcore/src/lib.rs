//! `cachemesh_heatcore`: the heat policy's prefix-chain core (core.rs) for Python. Keys are 64-bit
//! integers (the Python side interns other keys); evictions come back as (key, reason code) with the
//! codes of `REASONS`. `replay_prefix` takes a whole trace in one call.

mod core;
mod experts;
mod fastmod;
mod ghost;
mod guard;
mod heat;
mod index;
mod leaves;
mod panel;
mod pypanel;
mod reuse;
mod sketch;

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;

use crate::core::{Core, Meta, Params, EXTENDED, SAMPLED, UNSCORED, USED};
use crate::guard::root_sampled;

#[pyclass(module = "cachemesh_heatcore", unsendable)]
struct ChainHeat {
    core: Core,
    out: Vec<(i64, u8)>,
}

fn meta(trace: Option<i32>, ttl_ms: Option<i64>, cluster: Option<i64>) -> Meta {
    Meta {
        trace,
        ttl_ms,
        cluster,
    }
}

#[pymethods]
impl ChainHeat {
    #[new]
    #[pyo3(signature = (capacity, *, seed=0, chain_reuse=true, chain_reuse_weight=0.5, chain_half_life=3.0,
        chain_half_lives=vec![3.0, 10.0, 30.0], rescore_ms=100, rescore_accesses=None, neighbour_tau=0.1, cold_cluster=0.05,
        prior_recency=0.5, chain_guard=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        capacity: i64,
        seed: u64,
        chain_reuse: bool,
        chain_reuse_weight: f64,
        chain_half_life: f64,
        chain_half_lives: Vec<f64>,
        rescore_ms: i64,
        rescore_accesses: Option<i64>,
        neighbour_tau: f32,
        cold_cluster: f64,
        prior_recency: f64,
        chain_guard: bool,
    ) -> PyResult<Self> {
        if capacity <= 0 {
            return Err(PyValueError::new_err(format!(
                "capacity must be positive, got {capacity}"
            )));
        }
        let p = Params {
            capacity,
            seed,
            chain_reuse,
            chain_reuse_weight,
            chain_half_life,
            chain_half_lives,
            rescore_ms,
            rescore_accesses: rescore_accesses.unwrap_or(capacity / 8),
            neighbour_tau,
            cold_cluster,
            prior_recency,
            chain_guard,
            sketch: true,
        };
        Ok(ChainHeat {
            core: Core::new(p),
            out: Vec::new(),
        })
    }

    #[getter]
    fn capacity(&self) -> i64 {
        self.core.p.capacity
    }

    #[getter]
    fn used(&self) -> i64 {
        self.core.used_total
    }

    #[getter]
    fn tick(&self) -> i64 {
        self.core.tick
    }

    #[getter]
    fn rescores(&self) -> u64 {
        self.core.rescores
    }

    fn __contains__(&self, key: i64) -> bool {
        self.core.contains(key)
    }

    fn __len__(&self) -> usize {
        self.core.len()
    }

    #[pyo3(signature = (key, now_ms, parent=None, trace=None, ttl_ms=None, cluster=None))]
    #[allow(clippy::too_many_arguments)]
    fn on_hit(
        &mut self,
        key: i64,
        now_ms: i64,
        parent: Option<i64>,
        trace: Option<i32>,
        ttl_ms: Option<i64>,
        cluster: Option<i64>,
    ) -> PyResult<()> {
        let s = self
            .core
            .slot_of(key)
            .ok_or_else(|| PyKeyError::new_err(key))?;
        self.core
            .on_hit(s, key, now_ms, parent, &meta(trace, ttl_ms, cluster));
        Ok(())
    }

    #[pyo3(signature = (key, now_ms, size=1, parent=None, trace=None, ttl_ms=None, cluster=None))]
    #[allow(clippy::too_many_arguments)]
    fn on_miss(
        &mut self,
        key: i64,
        now_ms: i64,
        size: u32,
        parent: Option<i64>,
        trace: Option<i32>,
        ttl_ms: Option<i64>,
        cluster: Option<i64>,
    ) -> Vec<(i64, u8)> {
        self.out.clear();
        self.core.on_miss(
            key,
            now_ms,
            size,
            parent,
            &meta(trace, ttl_ms, cluster),
            &mut self.out,
        );
        std::mem::take(&mut self.out)
    }

    fn remove(&mut self, key: i64) {
        self.core.remove(key);
    }

    #[pyo3(signature = (trace, evict=true))]
    fn end_trace(&mut self, trace: i32, evict: bool) -> Vec<(i64, u8)> {
        let mut out = Vec::new();
        self.core.end_trace(trace, evict, &mut out);
        out
    }

    fn expire(&mut self, now_ms: i64) -> Vec<(i64, u8)> {
        let mut out = Vec::new();
        self.core.expire(now_ms, &mut out);
        out
    }

    #[pyo3(signature = (now_ms=None))]
    fn rescore(&mut self, now_ms: Option<i64>) {
        let now = now_ms.unwrap_or(self.core.now_ms);
        self.core.rescore(now);
    }

    /// Attention heat for a resident key: not read in chain mode (it is a feature of the model, which
    /// does not score chains); False where the key is not resident.
    fn observe_attention(&mut self, key: i64, heat: f32) -> bool {
        let _ = heat;
        self.core.contains(key)
    }

    fn observe_cluster(&mut self, key: i64, cluster: i64, distance: f32) {
        if let Some(s) = self.core.slot_of(key) {
            self.core.set_cluster(s, cluster, Some(distance));
        }
    }

    fn heat(&mut self, key: i64) -> Option<f64> {
        let s = self.core.slot_of(key)?;
        self.core.fresh_all();
        Some((self.core.eff_of(s) as f64).max(0.0))
    }

    /// (keys, effective heat, raw heat, cluster, has resident children) per resident entry, by slot.
    #[allow(clippy::type_complexity)]
    fn table<'py>(
        &mut self,
        py: Python<'py>,
    ) -> (
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<f32>>,
        Bound<'py, PyArray1<f32>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<bool>>,
    ) {
        self.core.fresh_all();
        let c = &self.core;
        let idx = c.resident();
        (
            PyArray1::from_iter(py, idx.iter().map(|&s| c.key[s])),
            PyArray1::from_iter(py, idx.iter().map(|&s| c.eff_of(s))),
            PyArray1::from_iter(py, idx.iter().map(|&s| c.raw[s])),
            PyArray1::from_iter(py, idx.iter().map(|&s| c.cluster_of(s))),
            PyArray1::from_iter(py, idx.iter().map(|&s| c.children[s] > 0)),
        )
    }

    /// The entries whose decision changed since this last gave them (`Core::changed`): keys,
    /// effective heat, cluster (-1: none) and decision code (1 keep, 2 keep-alive, 3 evict).
    #[allow(clippy::type_complexity)]
    fn changed<'py>(
        &mut self,
        py: Python<'py>,
        below: f64,
    ) -> (
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<f32>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<u8>>,
    ) {
        let changed = self.core.changed(below);
        let c = &self.core;
        (
            PyArray1::from_iter(py, changed.iter().map(|&(s, _)| c.key[s])),
            PyArray1::from_iter(py, changed.iter().map(|&(s, _)| c.eff_of(s))),
            PyArray1::from_iter(py, changed.iter().map(|&(s, _)| c.cluster_of(s))),
            PyArray1::from_iter(py, changed.iter().map(|&(_, code)| code)),
        )
    }

    /// Replays a prefix trace (request r covers keys[starts[r]:starts[r+1]], each block the parent of
    /// the next) as `sim.replay` does; returns the per-access hit mask (the resident prefix).
    fn replay_prefix<'py>(
        &mut self,
        py: Python<'py>,
        keys: PyReadonlyArray1<'py, i64>,
        starts: PyReadonlyArray1<'py, i64>,
        times: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray1<bool>>> {
        let (keys, starts, times) = (keys.as_slice()?, starts.as_slice()?, times.as_slice()?);
        if keys.len() != times.len() {
            return Err(PyValueError::new_err("keys and times differ in length"));
        }
        if starts.windows(2).any(|w| w[0] > w[1])
            || starts.last().is_some_and(|&e| e as usize > keys.len())
        {
            return Err(PyValueError::new_err(
                "starts must rise and stay within the keys",
            ));
        }
        let mut mask = vec![false; keys.len()];
        let none = Meta::default();
        let mut out = Vec::new();
        let core = &mut self.core;
        py.allow_threads(|| {
            for r in starts.windows(2) {
                let mut in_prefix = true;
                let mut parent: Option<i64> = None;
                for i in r[0] as usize..r[1] as usize {
                    let key = keys[i];
                    if let Some(s) = core.slot_of(key) {
                        core.on_hit(s, key, times[i], parent, &none);
                        mask[i] = in_prefix;
                    } else {
                        in_prefix = false;
                        out.clear();
                        core.on_miss(key, times[i], 1, parent, &none, &mut out);
                    }
                    parent = Some(key);
                }
            }
        });
        Ok(PyArray1::from_vec(py, mask))
    }

    /// Bytes the core holds.
    fn nbytes(&self) -> usize {
        self.core.bytes()
    }

    // -- taking over a Python HeatPolicy when it enters prefix mode ------------------------------------

    #[pyo3(signature = (slot, key, last_tick, crf, size, inserted_ms, ttl_ms, trace, depth, parent,
        children, freq, freq_epoch, cluster, distance, raw, eff, extended, unscored))]
    #[allow(clippy::too_many_arguments)]
    fn load_slot(
        &mut self,
        slot: usize,
        key: i64,
        last_tick: i64,
        crf: f64,
        size: u32,
        inserted_ms: i64,
        ttl_ms: i64,
        trace: i32,
        depth: i32,
        parent: i32,
        children: i32,
        freq: u8,
        freq_epoch: u32,
        cluster: i64,
        distance: f32,
        raw: f32,
        eff: f32,
        extended: bool,
        unscored: bool,
    ) -> PyResult<()> {
        let c = &mut self.core;
        if slot >= c.slots() || c.is(slot, USED) || c.contains(key) {
            return Err(PyValueError::new_err(format!(
                "slot {slot} out of range, taken, or key {key} held"
            )));
        }
        c.set(slot, USED, true);
        c.key[slot] = key;
        c.index.insert(key, slot as u32);
        c.last_tick[slot] = last_tick;
        c.crf[slot] = crf;
        c.size[slot] = size;
        c.used_total += size as i64;
        if ttl_ms > 0 {
            c.ttls_seen = true;
            c.ttl.insert(slot as u32, (inserted_ms, ttl_ms));
        }
        c.trace[slot] = trace;
        c.depth[slot] = depth;
        c.parent[slot] = parent;
        c.children[slot] = children;
        c.freq[slot] = freq;
        c.freq_epoch[slot] = freq_epoch;
        if cluster >= 0 {
            c.set_cluster(slot, cluster, Some(distance));
        }
        c.raw[slot] = raw;
        if eff != raw && eff >= 0.0 {
            c.eff.insert(slot as u32, eff);
        }
        c.set(slot, EXTENDED, extended);
        c.set(slot, UNSCORED, unscored);
        // (entries from before the chains began are their own roots)
        let sampled = c.guard.as_ref().is_some_and(|g| root_sampled(key, g.cut));
        c.set(slot, SAMPLED, sampled);
        Ok(())
    }

    #[pyo3(signature = (free, doomed, ended, tick, now_ms, last_rescore_ms, last_rescore_tick, rescores))]
    #[allow(clippy::too_many_arguments)]
    fn load_state(
        &mut self,
        free: Vec<u32>,
        doomed: Vec<(u32, u8)>,
        ended: Vec<i32>,
        tick: i64,
        now_ms: i64,
        last_rescore_ms: Option<i64>,
        last_rescore_tick: i64,
        rescores: u64,
    ) {
        let c = &mut self.core;
        c.set_free(&free);
        c.doomed = doomed;
        c.ended = ended.into_iter().collect();
        c.tick = tick;
        c.now_ms = now_ms;
        c.last_rescore_ms = last_rescore_ms;
        c.last_rescore_tick = last_rescore_tick;
        c.rescores = rescores;
    }

    fn load_ghosts(
        &mut self,
        tag: PyReadonlyArray1<'_, i64>,
        last: PyReadonlyArray1<'_, i64>,
        crf: PyReadonlyArray1<'_, f32>,
    ) -> PyResult<()> {
        let (tag, last, crf) = (tag.as_slice()?, last.as_slice()?, crf.as_slice()?);
        if !self.core.ghosts.load(tag, last, crf) {
            return Err(PyValueError::new_err("ghost table of another size"));
        }
        Ok(())
    }

    fn load_sketch(
        &mut self,
        table: &[u8],
        door: &[u8],
        additions: u64,
        resets: u32,
    ) -> PyResult<()> {
        self.core
            .sketch
            .load(table, door, additions, resets)
            .map_err(PyValueError::new_err)
    }

    /// The guard of the learned term and the half-life (`guard.GuardState`'s fields), None without one.
    #[allow(clippy::type_complexity)]
    fn guard_state(&self) -> Option<(bool, u64, u64, u64, u64, u64, f64, u64)> {
        self.core.guard.as_ref().map(|g| {
            (
                g.term_on,
                g.windows,
                g.windows_off,
                g.accesses,
                g.hits_with,
                g.hits_without,
                g.half_life(),
                g.switches,
            )
        })
    }

    /// The chain re-use model's counts: (yes, seen, labels).
    fn reuse_counts(&self) -> Option<(Vec<f64>, Vec<f64>, u64)> {
        self.core
            .reuse
            .as_ref()
            .map(|r| (r.yes.to_vec(), r.seen.to_vec(), r.labels))
    }

    /// The chain re-use model's counts (a checkpoint's); the pending labels are left as they are.
    fn load_reuse(&mut self, yes: [f64; 2], seen: [f64; 2], labels: u64) -> PyResult<()> {
        let r = self
            .core
            .reuse
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("chain re-use is off"))?;
        if (0..2).any(|b| !(0.0 <= yes[b] && yes[b] <= seen[b])) {
            return Err(PyValueError::new_err(
                "chain re-use counts must satisfy 0 <= yes <= seen",
            ));
        }
        r.yes = yes;
        r.seen = seen;
        r.labels = labels;
        r.refresh();
        Ok(())
    }

    /// The labels the chain re-use model waits for: key -> 2 * tick + extended, and (tick, key) in order.
    fn load_reuse_pending(
        &mut self,
        pending: Vec<(i64, i64)>,
        order: Vec<(i64, i64)>,
    ) -> PyResult<()> {
        let r = self
            .core
            .reuse
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("chain re-use is off"))?;
        r.pending = pending.into_iter().collect();
        r.order = order.into_iter().collect();
        Ok(())
    }

    fn start_chains(&mut self) {
        self.core.start_chains();
    }
}

#[pymodule]
fn cachemesh_heatcore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ChainHeat>()?;
    m.add_class::<pypanel::PyPanel>()?;
    m.add(
        "REASONS",
        (
            "capacity",
            "rejected",
            "expired",
            "context_ended",
            "cold_cluster",
        ),
    )?;
    Ok(())
}
