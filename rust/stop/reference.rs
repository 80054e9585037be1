//! The non-streamed result of the stop rule, computed the plain way: the reference the streaming
//! matcher is tested against, and usable for a whole text at once.

/// Cuts `text` at the stop that completes first (earliest end; then the longest; then the
/// lowest index) and returns the text before it (through it with `include_stop_str_in_output`)
/// and the stop's index in `stops`, or the whole text and `None`. O(len(text) * len(stops)).
/// An empty stop would match before any text; callers reject empty stops (see
/// [`super::StopStrings::new`]).
pub fn truncate_at_stop(
    text: &str,
    stops: &[String],
    include_stop_str_in_output: bool,
) -> (String, Option<usize>) {
    // The leftmost occurrence of a stop is also its earliest-ending one (its length is fixed),
    // so the first stop to complete is the minimum over stops of that end.
    let first = stops
        .iter()
        .enumerate()
        .filter_map(|(i, stop)| text.find(stop.as_str()).map(|at| (at + stop.len(), at, i)))
        .min();
    match first {
        Some((end, start, index)) => {
            let cut = if include_stop_str_in_output {
                end
            } else {
                start
            };
            (text[..cut].to_string(), Some(index))
        }
        None => (text.to_string(), None),
    }
}
