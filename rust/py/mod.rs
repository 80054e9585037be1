//! The Python module `ferrollm._core`: the only place that imports pyo3 and numpy. Each wrapper
//! extracts its inputs, releases the GIL for work that scales with the batch, calls the core and
//! converts the result; every core error is mapped to Python once, in `errors.rs`.

mod admit;
mod args;
mod arrays;
mod attention;
mod cpu;
mod detok;
mod errors;
mod grammar;
mod params;
mod quant;
mod raw;
mod request;
mod sampling;
mod sched_config;
mod scheduler;
mod step;
mod stop;
mod tensor;
mod tokens;
mod valid_request;
mod validate;

use pyo3::prelude::*;

use crate::types::FinishReason;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let names = [
        "",
        FinishReason::Stop.as_str(),
        FinishReason::Length.as_str(),
        FinishReason::Abort.as_str(),
        FinishReason::Timeout.as_str(),
        FinishReason::Error.as_str(),
    ];
    m.add("FINISH_REASON_NAMES", pyo3::types::PyTuple::new(py, names)?)?;
    m.add_class::<grammar::PyGrammarCompiler>()?;
    m.add_class::<grammar::PyCompiledGrammar>()?;
    m.add_class::<params::PySamplingParams>()?;
    m.add_class::<sched_config::PySchedulerConfig>()?;
    m.add_class::<request::PyNewRequest>()?;
    m.add_class::<scheduler::PyScheduler>()?;
    m.add_class::<scheduler::PyPrefillScheduler>()?;
    m.add_class::<step::PyStepPlan>()?;
    m.add_class::<step::PyStepOutput>()?;
    m.add_class::<validate::PyLimits>()?;
    m.add_class::<valid_request::PyValidRequest>()?;
    m.add_class::<admit::PyEngineLimits>()?;
    m.add_class::<raw::PyBody>()?;
    m.add_function(wrap_pyfunction!(validate::validate, m)?)?;
    m.add_function(wrap_pyfunction!(raw::_num_body_walks, m)?)?;
    m.add_class::<detok::PyDetokenizer>()?;
    m.add_class::<detok::PyDecodeStream>()?;
    m.add_class::<stop::PyStopMatcher>()?;
    m.add_function(wrap_pyfunction!(stop::py_truncate_at_stop, m)?)?;
    m.add_function(wrap_pyfunction!(attention::_paged_attention, m)?)?;
    m.add_class::<quant::PyGgmlWeight>()?;
    m.add_function(wrap_pyfunction!(quant::_ggml_dequantize_rows, m)?)?;
    m.add_function(wrap_pyfunction!(quant::_ggml_quantize, m)?)?;
    m.add_function(wrap_pyfunction!(quant::ggml_kernel_paths, m)?)?;
    m.add_function(wrap_pyfunction!(quant::ggml_block_types, m)?)?;
    m.add_class::<cpu::PyCpuFeatures>()?;
    m.add_function(wrap_pyfunction!(cpu::cpu_features, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::_use_openmp, m)?)?;
    m.add_function(wrap_pyfunction!(cpu::kernel_threads, m)?)?;
    m.add_class::<sampling::PySampler>()?;
    m.add_class::<sampling::PySampleResult>()?;
    m.add("ValidationError", py.get_type::<errors::ValidationError>())?;
    m.add("QueueFullError", py.get_type::<errors::QueueFullError>())?;
    m.add("SchedulerError", py.get_type::<errors::SchedulerError>())?;
    Ok(())
}
