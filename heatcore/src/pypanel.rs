//! `cachemesh_heatcore.Panel`: the compiled `ExpertPanel` (panel.rs) for Python. Keys are unsigned
//! 64-bit ints; the frame's heat comes from a Python callable once the owner sets one (its model),
//! else from the prior.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::experts::frame::FrameParams;
use crate::panel::{Panel, PanelParams};

#[pyclass(module = "cachemesh_heatcore", unsendable, name = "Panel")]
pub struct PyPanel {
    panel: Panel,
    heat: Option<PyObject>,
    width: usize,
}

/// Runs `f` with the frame's heat bound to `callable` (None: the prior); an error the callable
/// raised is returned after `f`.
fn with_heat<R>(
    py: Python<'_>,
    callable: &Option<PyObject>,
    width: usize,
    f: impl FnOnce(Option<&mut crate::experts::HeatFn>) -> R,
) -> PyResult<R> {
    let Some(callable) = callable else {
        return Ok(f(None));
    };
    let mut failed: Option<PyErr> = None;
    let mut heat = |rows: &[f32], n: usize| -> Vec<f64> {
        let got = (|| -> PyResult<Vec<f64>> {
            let x = PyArray1::from_slice(py, rows).reshape([n, width])?;
            let y = callable.call1(py, (x,))?;
            y.call_method0(py, "tolist")?.extract::<Vec<f64>>(py)
        })();
        match got {
            Ok(v) if v.len() == n => v,
            Ok(v) => {
                failed.get_or_insert(PyValueError::new_err(format!(
                    "heat gave {} values for {n} rows",
                    v.len()
                )));
                vec![0.0; n]
            }
            Err(e) => {
                failed.get_or_insert(e);
                vec![0.0; n]
            }
        }
    };
    let r = f(Some(&mut heat));
    match failed {
        Some(e) => Err(e),
        None => Ok(r),
    }
}

#[pymethods]
impl PyPanel {
    #[new]
    #[pyo3(signature = (capacity, experts, *, seed=0, sample=1, horizons=vec![32.0, 512.0],
        sigmas=vec![3.0, 2.0], min_lead=8.0, sketched=false, sketch_seed=0, owner_counts=false,
        layout=None, prior_recency=0.5))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        capacity: usize,
        experts: Vec<String>,
        seed: u64,
        sample: u64,
        horizons: Vec<f64>,
        sigmas: Vec<f64>,
        min_lead: f64,
        sketched: bool,
        sketch_seed: u64,
        owner_counts: bool,
        layout: Option<[usize; 8]>,
        prior_recency: f64,
    ) -> PyResult<Self> {
        if capacity == 0 {
            return Err(PyValueError::new_err("capacity must be positive, got 0"));
        }
        // (width, recency, interval, frequency, hits, size, ttl_left, trace_alive) of the feature rows
        let l = layout.unwrap_or([12, 0, 1, 2, 3, 6, 7, 8]);
        if l[1..].iter().any(|&i| i >= l[0]) {
            return Err(PyValueError::new_err("layout indices lie outside the row"));
        }
        let frame = FrameParams {
            width: l[0],
            recency: l[1],
            interval: l[2],
            frequency: l[3],
            hits: l[4],
            size: l[5],
            ttl_left: l[6],
            trace_alive: l[7],
            prior_recency,
        };
        let panel = Panel::new(PanelParams {
            capacity,
            names: experts,
            seed,
            sample,
            horizons,
            sigmas,
            min_lead,
            sketched,
            sketch_seed,
            owner_counts,
            frame,
        })
        .map_err(PyValueError::new_err)?;
        Ok(PyPanel {
            panel,
            heat: None,
            width: l[0],
        })
    }

    /// The frame's heat from now on: `callable(rows: float32[n, width]) -> n heats`, or None for
    /// the prior.
    fn set_heat(&mut self, callable: Option<PyObject>) {
        self.heat = callable;
    }

    /// One access; the keys the driver evicted (or rejected).
    #[pyo3(signature = (key, chained=false))]
    fn access(&mut self, py: Python<'_>, key: u64, chained: bool) -> PyResult<Vec<u64>> {
        let panel = &mut self.panel;
        with_heat(py, &self.heat, self.width, |heat| {
            panel.access(key, chained, heat).to_vec()
        })
    }

    fn follow(&mut self, py: Python<'_>, expert: usize, resident: Vec<u64>) -> PyResult<()> {
        let panel = &mut self.panel;
        with_heat(py, &self.heat, self.width, |heat| {
            panel.follow(expert, &resident, heat)
        })?
        .map_err(PyValueError::new_err)
    }

    /// Every expert (and the driver) drops `key`.
    fn remove(&mut self, key: u64) {
        self.panel.remove(key);
    }

    /// The experts whose miniature holds `key`.
    fn holders(&self, key: u64) -> Vec<usize> {
        self.panel.holders(key)
    }

    fn holds(&self, key: u64) -> bool {
        self.panel.holds(key)
    }

    fn driver_len(&self) -> usize {
        self.panel.driver_len()
    }

    #[pyo3(signature = (i, j, horizon=0))]
    fn lead(&self, i: usize, j: usize, horizon: usize) -> PyResult<f64> {
        let (experts, horizons) = self.panel.shape();
        if i >= experts || j >= experts || horizon >= horizons {
            return Err(PyValueError::new_err(format!(
                "no lead ({i}, {j}) at horizon {horizon}: {experts} experts, {horizons} horizons"
            )));
        }
        Ok(self.panel.lead(i, j, horizon))
    }

    fn challengers(&self) -> Vec<(usize, f64)> {
        self.panel.challengers()
    }

    fn missing(&self, expert: usize, resident: Vec<u64>) -> PyResult<f64> {
        if expert >= self.panel.shape().0 {
            return Err(PyValueError::new_err(format!("no expert {expert}")));
        }
        Ok(self.panel.missing(expert, &resident))
    }

    fn invalidate(&mut self) {
        self.panel.invalidate();
    }

    fn frequency(&self, key: u64) -> u8 {
        self.panel.frequency(key)
    }

    /// One access of `key` in the owner's sketch (with `owner_counts`).
    fn count(&mut self, key: u64) {
        self.panel.count(key);
    }

    #[getter]
    fn sketch_resets(&self) -> u32 {
        self.panel.sketch().resets
    }

    /// (counters, doorkeeper, additions, resets) of the owner's sketch, as `ChainHeat.load_sketch`
    /// and `FrequencySketch` hold them.
    fn sketch_state<'py>(
        &self,
        py: Python<'py>,
    ) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>, u64, u32) {
        let s = self.panel.sketch();
        let (table, door) = s.state();
        (
            PyBytes::new(py, table),
            PyBytes::new(py, door),
            s.additions,
            s.resets,
        )
    }

    #[getter]
    fn leader(&self) -> usize {
        self.panel.leader
    }

    #[getter]
    fn sample(&self) -> u64 {
        self.panel.sample()
    }

    #[getter]
    fn hits(&self) -> Vec<u64> {
        self.panel.hits.clone()
    }

    #[getter]
    fn switches(&self) -> u64 {
        self.panel.switches
    }

    #[getter]
    fn contested(&self) -> bool {
        self.panel.contested
    }

    #[getter]
    fn native_bytes(&self) -> usize {
        self.panel.bytes()
    }
}
