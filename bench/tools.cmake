# Tools: vmmarena-stat (a snapshot JSON shown as tables) and the strict JSON parser it
# shares with the tests.
add_library(vmmarena_json_min STATIC ${CMAKE_CURRENT_LIST_DIR}/json_min.c)
target_include_directories(vmmarena_json_min PUBLIC ${CMAKE_CURRENT_LIST_DIR})

add_executable(vmmarena-stat ${CMAKE_CURRENT_LIST_DIR}/vmmarena-stat.c)
target_link_libraries(vmmarena-stat PRIVATE vmmarena_json_min)
install(TARGETS vmmarena-stat RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

if(VMMARENA_TESTS)
  enable_testing()
  add_test(NAME vmmarena_stat
    COMMAND ${CMAKE_COMMAND} -DSTAT=$<TARGET_FILE:vmmarena-stat>
      -DSAMPLE=${PROJECT_SOURCE_DIR}/tests/data/snapshot-sample.json
      -DWORK=${CMAKE_CURRENT_BINARY_DIR}/vmmarena-stat-test
      -P ${CMAKE_CURRENT_LIST_DIR}/vmmarena-stat-test.cmake)
  # The cmocka suites parse snapshots back with the same parser. tests/ is added after
  # bench/, so the link waits for the end of the top-level directory.
  cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR}
    CALL target_link_libraries vmmarena_testutil PUBLIC vmmarena_json_min)
endif()
