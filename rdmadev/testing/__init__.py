"""Test and demo infrastructure: a loopback TF cluster launcher (launch), the two-process
bootstrap over a pipe (pair), and alternating timing of tf.function variants (timing)."""
