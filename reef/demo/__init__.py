"""The bundled demo task (`reef.demo.task`): single-digit addition with a programmatic verifier."""
