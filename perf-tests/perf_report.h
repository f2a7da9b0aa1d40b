// Output of the perf suite: nccl-tests' table and footer, JSON, CSV, a
// gnuplot plot, and the progress line. Everything here runs on rank 0 only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "perf_options.h"

namespace loom::perf {

struct Measure {
  double time_us = 0;
  double algbw = 0;  // decimal GB/s
  double busbw = 0;
  double wrong = -1;  // -1: not checked
};

struct Row {
  size_t size_bytes = 0;
  size_t count = 0;
  DataType dt = DataType::kFloat32;  // the combination measured (-d/-o/-r all vary them)
  RedOp op = RedOp::kSum;
  int root = 0;
  Measure out_of_place, in_place;
  bool has_mpi = false;
  Measure mpi;  // MPI's collective, out of place, same buffers
};

// What the header and the JSON describe.
struct RunInfo {
  Bench bench = Bench::kAllReduce;
  int nranks = 0;
  std::string host;
  std::string bootstrap;   // "env", "mpi"
  std::string algorithm;   // -A value or "auto"
  std::string mpi_library;  // version string when --baseline mpi
  Options opts;
};

class Report {
 public:
  explicit Report(RunInfo info);
  // Header lines (the table goes to stdout unless --json/--csv took stdout).
  void begin(const std::vector<std::string>& extra_header_lines);
  void add(const Row& row);
  // Footer, files, plot. Returns false if a file could not be written.
  // wrong_total: wrong elements of every verification; failed_tests: the
  // (test, rank) pairs that saw any, nccl-tests' "Out of bounds values".
  // *bw_ok: false when NCCL_TESTS_MIN_BW is set and the average bus
  // bandwidth is below 90% of it (nccl-tests' check and margin).
  bool finish(double wrong_total, double failed_tests, bool failed, bool* bw_ok);
  double avg_busbw() const;

 private:
  void print_row(const Row& row);
  const char* op_label(const Row& r) const;  // "none" where the collective has no op
  int root_label(const Row& r) const;        // -1 where it has no root
  std::string json_text(double wrong_total, double failed_tests) const;
  std::string csv_text() const;
  bool write_plot() const;

  RunInfo info_;
  bool table_;  // the nccl-tests table goes to stdout
  std::vector<Row> rows_;
  double bw_sum_ = 0;
  int bw_count_ = 0;
};

// A progress line on stderr: "[allreduce] 4194304 B (5/12)  ETA 0:12".
// Only active on a TTY or when forced; cleared by done().
class Progress {
 public:
  Progress(bool enabled, const char* name, const std::vector<size_t>& sizes);
  void start(size_t index);  // about to measure sizes[index]
  void done();

 private:
  bool enabled_, tty_;
  const char* name_;
  std::vector<size_t> sizes_;
  std::chrono::steady_clock::time_point t0_;
  double weight_done_ = 0, weight_total_ = 0;
  size_t index_ = 0;
  bool started_ = false;
};

}  // namespace loom::perf
