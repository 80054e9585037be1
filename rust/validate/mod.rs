//! placeholder: validate (being written).
