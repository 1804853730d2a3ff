# ctest of vmmarena-stat (run with cmake -P): the tables of the committed sample snapshot
# (tests/data/snapshot-sample.json, written by a real arena on the fake driver), the same from
# standard input, and exit status 2 with a clear message for each kind of bad input.
#   -DSTAT=path of vmmarena-stat  -DSAMPLE=the sample snapshot  -DWORK=a scratch directory
foreach(var STAT SAMPLE WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "vmmarena-stat-test.cmake needs -D${var}=...")
  endif()
endforeach()
file(MAKE_DIRECTORY ${WORK})

set(failures 0)
macro(fail what)
  message(SEND_ERROR "vmmarena-stat: ${what}")
  math(EXPR failures "${failures} + 1")
endmacro()

# Runs vmmarena-stat with the arguments after `input` (an input file for stdin, or "").
function(run_stat out_rc out_stdout out_stderr input)
  if(input)
    execute_process(COMMAND ${STAT} ${ARGN} INPUT_FILE ${input} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  else()
    execute_process(COMMAND ${STAT} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  endif()
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_stdout} "${o}" PARENT_SCOPE)
  set(${out_stderr} "${e}" PARENT_SCOPE)
endfunction()

# ---- The sample: every section, with its figures --------------------------------------
run_stat(rc shown err "" ${SAMPLE})
if(NOT (rc EQUAL 0))
  fail("exit status ${rc} on the sample (stderr: ${err})")
endif()
set(expected_lines
  "vmmarena snapshot \\(schema version 1\\): device 0, discrete GPU"
  "retention on \\(mode on\\)[;] reuse exact[;] stitching on[;] granularity 2.0 MiB"
  "headroom 2.0 GiB[;] limit 64.0 GiB"
  "physical +16.2 GiB +16.2 GiB"
  "reserved VA +256.0 GiB in 1 reservation\n"
  "operations +16 allocs, 5 frees, 0 deferred frees"
  "package +7 / 14.1 GiB +0 / 0 B +1 / 32.0 MiB +0 / 0 B\n"
  "transient +4 / 1.4 GiB +2 / 736.0 MiB +0 / 0 B +0 / 0 B\n"
  "idle mappings +2 \\(736.0 MiB\\) in 2 buckets"
  "hits 2, misses 7, hit rate 22.2%, fallbacks 0, stitches 0"
  "bucket +96.0 MiB x 1\n +bucket +640.0 MiB x 1\n"
  "out of memory 0, limit 2, headroom 0"
  "active \\(id 1\\)[;] begun 1, finished 0, aborted 0"
  # tags, largest first
  "kv-cache +8.0 GiB +1 allocation\n +weights +6.0 GiB +5 allocations\n +warmup bs=16 +1.4 GiB +3 allocations\n"
  " +graph operands +64.0 MiB +1 allocation\n +\\(no tag\\) +2.0 MiB +1 allocation\n"
  "cuMemUnmap +2 +1 +0.001 +0.36\n"
  "all +104 +1 +0.012\n"
  "VMM_ERR_DRIVER: unmapping package 256.0 MiB at 0x7f3e91400000: cuMemUnmap returned CUDA_ERROR_ILLEGAL_ADDRESS \\(700\\)"
  "package 60.0 GiB refused \\(requested 64424509440 B, rounded 64424509440 B\\): limit 64.0 GiB"
  "Inventory: 13 mappings, 16.2 GiB\n"
  "package +live +7 +14.1 GiB\n +transient +live +4 +1.4 GiB\n +transient +pooled +2 +736.0 MiB\n"
  "Largest 10:"
  "0x7f3c7fe00000 +8.0 GiB +8.0 GiB +package +live +1 +0 +kv-cache\n"
  "0x7f3c57e00000 +640.0 MiB +640.0 MiB +transient +pooled +1 +1 +warmup bs=8\n")
foreach(line IN LISTS expected_lines)
  string(REGEX MATCH "${line}" found "${shown}")
  if(NOT (NOT found STREQUAL ""))
    fail("the sample's output lacks /${line}/")
  endif()
endforeach()
string(REGEX MATCHALL "\n  0x7f" rows "${shown}")
list(LENGTH rows row_count)
if(NOT (row_count EQUAL 10))
  fail("${row_count} inventory rows, expected the largest 10")
endif()

# The same document on standard input, as "-" and with no argument.
run_stat(rc from_dash err ${SAMPLE} -)
if(NOT (rc EQUAL 0 AND from_dash STREQUAL shown))
  fail("\"-\" (stdin) differs from the file")
endif()
run_stat(rc from_stdin err ${SAMPLE})
if(NOT (rc EQUAL 0 AND from_stdin STREQUAL shown))
  fail("no argument (stdin) differs from the file")
endif()

# ---- Bad input: exit status 2, a message saying where, nothing on stdout ----------------
file(READ ${SAMPLE} sample_text)
function(write_case name text)
  file(WRITE ${WORK}/${name}.json "${text}")
endfunction()
write_case(syntax "{\n  \"schema\": \"vmmarena.snapshot\",\n  \"version\": 1,\n  oops\n}\n")
string(SUBSTRING "${sample_text}" 0 1000 truncated)
write_case(truncated "${truncated}")
write_case(empty "")
write_case(schema "{\"schema\": \"something.else\", \"version\": 1}")
write_case(version "{\"schema\": \"vmmarena.snapshot\", \"version\": 2}")
string(REPLACE "\"hits\"" "\"hitz\"" missing_key "${sample_text}")
write_case(missing_key "${missing_key}")
string(REPLACE "\"misses\": 7" "\"misses\": \"7\"" wrong_type "${sample_text}")
write_case(wrong_type "${wrong_type}")
string(REPLACE "\"misses\": 7" "\"misses\": -7" negative "${sample_text}")
write_case(negative "${negative}")
string(REPLACE "\"state\": \"pooled\"" "\"state\": \"floating\"" bad_state "${sample_text}")
write_case(bad_state "${bad_state}")

set(bad_cases
  "syntax|syntax.json: line 4, column 3: expected a string key, found 'o'"
  "truncated|truncated.json: line [0-9]+, column [0-9]+: "
  "empty|empty.json: line 1, column 1: expected a value, found end of input"
  "schema|not a vmmarena snapshot: \"schema\" is \"something.else\", expected \"vmmarena.snapshot\""
  "version|snapshot version 2 is not supported \\(this tool reads version 1\\)"
  "missing_key|snapshot key \"pool.hits\" is missing"
  "wrong_type|snapshot key \"pool.misses\" \\(line [0-9]+, column [0-9]+\\) is a string, expected a number"
  "negative|snapshot key \"pool.misses\" \\(line [0-9]+, column [0-9]+\\) is -7, expected a non-negative integer"
  "bad_state|snapshot key \"mappings\\[[0-9]+\\].state\" has an unknown value \"floating\"")
foreach(case IN LISTS bad_cases)
  string(FIND "${case}" "|" bar)
  string(SUBSTRING "${case}" 0 ${bar} name)
  math(EXPR after "${bar} + 1")
  string(SUBSTRING "${case}" ${after} -1 pattern)
  run_stat(rc out err "" ${WORK}/${name}.json)
  if(NOT (rc EQUAL 2))
    fail("${name}: exit status ${rc}, expected 2")
  endif()
  if(NOT (out STREQUAL ""))
    fail("${name}: printed a table for bad input")
  endif()
  string(REGEX MATCH "${pattern}" found "${err}")
  if(NOT (NOT found STREQUAL ""))
    fail("${name}: stderr \"${err}\" lacks /${pattern}/")
  endif()
endforeach()

run_stat(rc out err "" ${WORK}/does-not-exist.json)
string(FIND "${err}" "cannot open ${WORK}/does-not-exist.json: No such file or directory" at)
if(NOT (rc EQUAL 2 AND at GREATER -1))
  fail("a missing file: exit ${rc}, stderr \"${err}\"")
endif()
run_stat(rc out err "" a.json b.json)
string(FIND "${err}" "usage: vmmarena-stat [FILE]" at)
if(NOT (rc EQUAL 2 AND at GREATER -1))
  fail("two files: exit ${rc}, stderr \"${err}\"")
endif()
run_stat(rc out err "" --help)
string(FIND "${out}" "usage: vmmarena-stat [FILE]" at)
if(NOT (rc EQUAL 0 AND at GREATER -1))
  fail("--help: exit ${rc}")
endif()

if(failures GREATER 0)
  message(FATAL_ERROR "vmmarena-stat: ${failures} check(s) failed")
endif()
