# Writes build_info.h at build time (not configure time), so artifacts name the commit that
# was actually built. configure_file leaves the file untouched when nothing changed.
# A copy of the tree whose git metadata is not its own (e.g. a working tree shipped to a GPU
# machine over an older checkout) names its commit through the environment instead:
#   ATLAS_GIT_COMMIT=<sha> cmake --build ...
if(DEFINED ENV{ATLAS_GIT_COMMIT} AND NOT "$ENV{ATLAS_GIT_COMMIT}" STREQUAL "")
  set(ATLAS_GIT_COMMIT "$ENV{ATLAS_GIT_COMMIT} (from ATLAS_GIT_COMMIT)")
  configure_file(${SRC}/src/core/build_info.h.in ${OUT} @ONLY)
  return()
endif()
execute_process(COMMAND git rev-parse HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE ATLAS_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT ATLAS_GIT_COMMIT)
  set(ATLAS_GIT_COMMIT "unknown")
else()
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY ${SRC} RESULT_VARIABLE dirty ERROR_QUIET)
  if(NOT dirty EQUAL 0)
    set(ATLAS_GIT_COMMIT "${ATLAS_GIT_COMMIT}-dirty")
  endif()
endif()
configure_file(${SRC}/src/core/build_info.h.in ${OUT} @ONLY)
