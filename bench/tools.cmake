# The tools are the Python package's command line (`python3 -m vmmarena stat|memviz`,
# shim/python/vmmarena/_cli.py); their tests run here. json_min is the strict JSON parser that
# tests/test_snapshot.c parses snapshots with: built for the test suite only, it goes once that
# test reads JSON another way.
if(VMMARENA_TESTS)
  add_library(vmmarena_json_min STATIC ${CMAKE_CURRENT_LIST_DIR}/json_min.c)
  target_include_directories(vmmarena_json_min PUBLIC ${CMAKE_CURRENT_LIST_DIR})
  # tests/ is added after bench/, so the link waits for the end of the top-level directory.
  cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR}
    CALL target_link_libraries vmmarena_testutil PUBLIC vmmarena_json_min)

  find_program(VMMARENA_PYTHON NAMES python3 HINTS /usr/bin DOC "python3 that runs the Python tests")
  if(VMMARENA_PYTHON)
    enable_testing()
    set(cli_env "PYTHONPATH=${PROJECT_SOURCE_DIR}/shim/python" "PYTHONDONTWRITEBYTECODE=1")
    if(VMMARENA_SHIM AND NOT VMMARENA_SANITIZE)  # the live snapshot case loads the shim
      list(APPEND cli_env "VMMARENA_LIBRARY=$<TARGET_FILE:vmmarena_torch>"
        "VMMARENA_FAKE_DRIVER=$<TARGET_FILE:vmmarena_fake_driver>")
    endif()
    add_test(NAME python_cli COMMAND ${VMMARENA_PYTHON} -m unittest -v test_stat test_memviz
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/tests/python)
    set_tests_properties(python_cli PROPERTIES ENVIRONMENT "${cli_env}" TIMEOUT 300)
  endif()
endif()
