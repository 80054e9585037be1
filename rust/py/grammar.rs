//! `GrammarCompiler` and `CompiledGrammar` for Python: compile a request's grammar (off the
//! engine thread, GIL released) and hand the result to `Scheduler.add_request(grammar=...)`.

use std::sync::Arc;

use pyo3::prelude::*;

use super::detok::PyDetokenizer;
use super::errors::guard;
use crate::error::CoreError;
use crate::grammar::{GrammarCompiler, GrammarKind, GrammarSpec, GrammarState};
use crate::types::TokenId;

#[pyclass(name = "GrammarCompiler", module = "ferrollm._core", frozen)]
pub struct PyGrammarCompiler {
    inner: Arc<GrammarCompiler>,
}

/// A compiled grammar's initial state; each request that uses it gets its own copy.
#[pyclass(name = "CompiledGrammar", module = "ferrollm._core", frozen)]
pub struct PyCompiledGrammar {
    pub(crate) inner: GrammarState,
}

#[pymethods]
impl PyCompiledGrammar {
    /// How many of `token_ids` the grammar takes in order from its start (it stops at the
    /// first it refuses), and whether it could end right after them. For tests and tools that
    /// check a text against a grammar; the grammar itself is unchanged.
    fn check_tokens(&self, py: Python<'_>, token_ids: Vec<TokenId>) -> (usize, bool) {
        let state = &self.inner;
        py.detach(|| state.check_tokens(&token_ids))
    }
}

#[pymethods]
impl PyGrammarCompiler {
    #[new]
    fn new(
        py: Python<'_>,
        tokenizer: PyRef<'_, PyDetokenizer>,
        eos_token_ids: Vec<TokenId>,
    ) -> PyResult<Self> {
        let detok = tokenizer.inner.clone();
        let built = py.detach(|| {
            guard("GrammarCompiler()", || {
                GrammarCompiler::new(detok, &eos_token_ids)
            })
        })??;
        Ok(PyGrammarCompiler {
            inner: Arc::new(built),
        })
    }

    /// Compiles a grammar of `kind` ("json_object", "json_schema", "regex", "choice", "lark")
    /// from `text`; errors name `field`. Cached by kind and text.
    fn compile(
        &self,
        py: Python<'_>,
        kind: &str,
        text: String,
        field: String,
    ) -> PyResult<PyCompiledGrammar> {
        let Some(kind) = GrammarKind::parse(kind) else {
            return Err(CoreError::invalid(
                field.clone(),
                "invalid_value",
                format!("`{field}`: unknown grammar kind {kind:?}"),
            )
            .into());
        };
        let spec = GrammarSpec { kind, text, field };
        let compiler = self.inner.clone();
        let state =
            py.detach(|| guard("GrammarCompiler.compile", || compiler.compile(&spec)))??;
        Ok(PyCompiledGrammar { inner: state })
    }

    /// Token ids the masks cover.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
}
