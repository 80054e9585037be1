//! placeholder: sampling (being written).
