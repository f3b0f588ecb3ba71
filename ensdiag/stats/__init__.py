"""The maths every analyzer and statistic across runs reads: per-example quantities (`Examples`), one weighted
function per statistic, the bootstrap draws and interval constructions, OOD scores, the temperature solver."""
