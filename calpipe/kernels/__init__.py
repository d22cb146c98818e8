"""Numeric kernels (numba/numpy): contiguous arrays and state in, outputs and state out.

Kernels know nothing of polars, DuckDB or dagster, keep no globals and never write their inputs;
the calibrators (:mod:`calpipe.calibrators`) validate parameters and call them. Where each
paper's equations live:

=========================  =================================================  ====================================
module                     implements                                         source
=========================  =================================================  ====================================
``ops``                    the operation list every recursive kernel runs     calpipe's replay contract
                           (step / forecast / delayed update, by stream)      (docs/ARCHITECTURE.md §4)
``numeric``                stack scratch, bit casts, fdlibm exp/log, tree     fdlibm ``e_exp.c``, ``e_log.c``
                           sums, the lane scheduler of multi-stream engines
``calfun``                 calibrating functions inside the kernels           paper 000 eqs. (1), (3), (4), (5);
                                                                              paper 001 eq. (1)
``mixture``                Jumper, Mean Jumper, Composite Jumper (log loss),  paper 000 Algorithms 1-2, §5;
                           the jump-mixing step, serving-map weights          paper 001 Algorithm 1
``brier_compat``           Brier-loss recursion of protected-classification   the package's source
                           0.1.5 (K classes; binary dispatch), log10 CJ       (docs/REFERENCE_DATA.md)
``brier_binary``           the binary engines of that recursion (one stream,  as ``brier_compat``
                           64 SIMD lanes)
``grouping``               O(n) dense stream ids (hash) and counting sort     —
``venn``                   online and inductive Venn predictors               paper 002 §3, §4
``venn_abers``             IVAP / CVAP, fast algorithm, multiclass coupling   Vovk & Petej 2014; Vovk, Petej &
                                                                              Fedorova 2015 (Algorithms 1-2)
``isotonic``               PAV isotonic regression; ROC-regularized isotonic  paper 003 Algorithm 2
                           regression (binary hull, multiclass partitioning)
``parametric``             Platt, beta, temperature scaling (Newton fits)     Platt 1999; Kull et al. 2017;
                                                                              Guo et al. 2017
``histogram``              equal-mass histogram binning                       Zadrozny & Elkan 2001
``calibrated_regression``  online ridge on test functions, fixed-point        paper 004 Algorithm 2
                           forecast
``online_scaling``         online Platt / beta / vector / matrix scaling      Gupta & Ramdas, ICML 2023
                           (ONS), tracking and hedging calibeating, online    (Algorithm 1, §3);
                           histogram binning                                  Guo et al. 2017 (matrix)
``decay_beta``             beta calibration refitted on exponentially         Kull et al. 2017 (the model);
                           forgotten log-odds bin counts (``decay-beta``)     calpipe (the forgetting)
``decay_venn_abers``      Venn-ABERS (IVAP) refitted on the same forgotten   Vovk & Petej 2014 (Algorithm 1)
                           bin counts (``decay-venn-abers``)
``expert_mixture``         Composite Jumper over experts (inputs x Cox        paper 001 Algorithm 1
                           functions): the default ``composite-experts``
``diagnostics``            smooth ECE; CORP decomposition (PAV)               Błasiok & Nakkiran 2024;
                                                                              Dimitriadis et al. 2021
``prediction``             the fitted-map container of the batch kernels      —
=========================  =================================================  ====================================
"""
