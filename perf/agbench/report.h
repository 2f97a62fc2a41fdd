// Output: the nccl-tests table (with baseline columns appended), -v statistics, JSON.
#pragma once

#include <string>
#include <vector>

#include "bench.h"

namespace agbench {

void printPreamble(const Args& a, const World& w, const std::vector<RankInfo>& ranks);
void printHeader(const Args& a, const World& w);
void printRow(const Args& a, const World& w, const Row& row);
void printRowStats(const Row& row);
// Returns the average bus bandwidth of the measured hicoll path (nccl-tests' figure).
double printFooter(const Args& a, const World& w, const std::vector<Row>& rows, long long wrong_total,
                   long long baseline_wrong);
void printFinalStats(const std::vector<hcStats>& all);
void writeJson(const Args& a, const World& w, const std::vector<RankInfo>& ranks, const std::vector<Row>& rows,
               long long wrong_total, long long baseline_wrong, const std::vector<hcStats>& final_stats);

}  // namespace agbench
