# Writes version.cpp with the git commit of the source tree, at every build (cmake -P script):
# every benchmark result names the code that made it, and "-dirty" marks a binary built from
# uncommitted changes. configure_file rewrites the file only when the text changes, so a build
# that changes nothing recompiles nothing.
#   cmake -DSOURCE_DIR=<repo> -DOUTPUT=<build>/version.cpp -P version.cmake
execute_process(COMMAND git describe --always --dirty=-dirty --abbrev=12 --match=NoTagsHere
                WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE TETRA_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT TETRA_GIT_COMMIT)
  set(TETRA_GIT_COMMIT "unknown")
endif()
configure_file(${SOURCE_DIR}/src/core/version.cpp.in ${OUTPUT} @ONLY)
