// Output: the nccl-tests table (with baseline columns appended), -v statistics, JSON.
#pragma once

#include <string>
#include <vector>

#include "bench.h"

namespace agbench {

// nccl-tests' timestamp format (-S), and the time now in it.
constexpr const char* kTimestampFormat = "%Y-%m-%d %H:%M:%S";
std::string nowStamp();

void printPreamble(const Args& a, const World& w, const std::vector<RankInfo>& ranks);
void printHeader(const Args& a, const World& w);
void printRow(const Args& a, const World& w, const Row& row);
void printRowStats(const Row& row);
// Returns the average bus bandwidth of the measured hicoll path (nccl-tests' figure).
double printFooter(const Args& a, const World& w, const std::vector<Row>& rows, long long wrong_total,
                   long long baseline_wrong);
// nccl-tests' NCCL_TESTS_MIN_BW (GB/s): the run fails when the average bus bandwidth is
// below 0.9 of it. -1: not set; 0: OK; 1: FAILED (the footer says which).
int minBandwidthVerdict(double avg_busbw);
// -M: the ranks' peak resident memory (bytes, per rank) and the measured buffers' size.
void printMemory(const Args& a, const std::vector<double>& peak_rss, size_t buffer_bytes);
// nccl-tests' last line: "# Collective test concluded: <program>".
void printConcluded(const Args& a);
void printFinalStats(const std::vector<hcStats>& all);
void writeJson(const Args& a, const World& w, const std::vector<RankInfo>& ranks, const std::vector<Row>& rows,
               long long wrong_total, long long baseline_wrong, const std::vector<hcStats>& final_stats);

}  // namespace agbench
