"""Media in front of a text decoder: what a request's media becomes for the engine
(`inputs`), and the model-side processor that turns decoded media and a prompt into token ids
and encoder inputs."""
